"""The instability guard's settings, refusals and records, the extension point it calls, the
rate a resume keeps, and the figures every metrics report carries (grad_norm, tokens, per-rank
memory and step time), in process on the real engine with tiny models. The 2-rank proof (skip,
rollback, stop) is tests/integration/runtime/test_runtime_instability.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from torch.utils.data import TensorDataset

import ace3
import ace3.runtime.build
from ace3.config.events import InstabilityRecord, RefusedRecord, parse_record
from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.loop.run_metrics import MAX_RANKS_SHOWN, per_rank_values
from ace3.runtime.loop.steps import count_tokens
from ace3.runtime.parallel.base import Strategy
from ace3_worker.ingest import instability_notice

_inputs = torch.linspace(-1.0, 1.0, 160).reshape(40, 4)
DATA = TensorDataset(_inputs, _inputs.sum(dim=1, keepdim=True))  # 10 batches of 4: 10 steps
BASE = {"batch_size": 4, "epochs": 1, "validation_split": 0.0, "learning_rate": 0.05,
        "optimizer": "sgd", "seed": 0, "log_interval": 4}  # fmt: skip


class NanAt(nn.Module):
    """NaN output at training forward pass ``at`` (one a step here)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net, self.at, self.forwards = nn.Linear(4, 1), at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if self.training:
            self.forwards += 1
            if self.forwards == self.at:
                out = out * float("nan")
        return out


def train(model: nn.Module, save_dir: Path | None = None, resume: Path | None = None,
          **fields: Any) -> Any:  # fmt: skip
    config = ace3.TrainingConfig(**{**BASE, **fields})
    checkpoints = None
    if save_dir is not None:
        checkpoints = ace3.CheckpointConfig(
            save_dir=str(save_dir), save_interval=fields.get("save_interval")
        )
    trainer = ace3.Trainer(config, checkpoint_config=checkpoints)
    if resume is not None:
        trainer.load_checkpoint(resume)
    return trainer.train(model, DATA, resume=resume is not None)


# -- settings and refusals ---------------------------------------------------------------------


def test_settings_are_checked_and_travel_as_json() -> None:
    guard = ace3.InstabilityConfig(action="rollback", window=5, max_grad_norm_spike=10.0)
    config = ace3.TrainingConfig(instability=guard, save_interval=2)
    again = ace3.TrainingConfig.model_validate_json(config.model_dump_json())
    assert again.instability == guard and ace3.TrainingConfig().instability is None
    for bad in ({"action": "ignore"}, {"explosion_factor": 1.0}, {"lr_factor": 1.0},
                {"window": 0}, {"max_grad_norm_spike": -1.0}, {"typo": 1}):  # fmt: skip
        with pytest.raises(ValidationError):
            ace3.InstabilityConfig(**bad)


@pytest.mark.parametrize(
    ("fields", "refused"),
    [
        ({"save_interval": 5}, False),
        ({}, True),  # nothing to roll back to
        ({"save_interval": 5, "num_gpus": 2, "zero_stage": 1}, True),
        ({"save_interval": 5, "num_gpus": 2, "tensor_parallel_size": 2}, True),
        ({"save_interval": 5, "num_nodes": 2}, True),
    ],
)
def test_rollback_is_refused_where_it_cannot_apply(fields: dict[str, Any], refused: bool) -> None:
    config = ace3.TrainingConfig(instability=ace3.InstabilityConfig(action="rollback"), **fields)
    problems = [p for p in ace3.unsupported_settings(config) if p.field == "instability"]
    assert bool(problems) == refused
    skip = ace3.TrainingConfig(instability=ace3.InstabilityConfig(action="skip"), **fields)
    assert not [p for p in ace3.unsupported_settings(skip) if p.field == "instability"]


def test_rollback_without_a_save_dir_is_refused_in_process() -> None:
    with pytest.raises(ace3.UnsupportedFeatureError, match="give the Trainer a save_dir"):
        train(NanAt(3), instability=ace3.InstabilityConfig(action="rollback"), save_interval=2)


# -- the record, through the worker's validation ----------------------------------------------


def test_the_record_is_validated_and_becomes_a_log_notice() -> None:
    line = {"type": "instability", "step": 5, "epoch": 1.0, "action": "rollback",
            "reason": "loss nan", "loss": None, "grad_norm": 3.5, "lr_scale": 0.5,
            "rolled_back_to_step": 3}  # fmt: skip
    record = parse_record(json.dumps(line).encode())
    assert isinstance(record, InstabilityRecord)
    assert instability_notice(record) == (
        "ace3: training instability at step 5: loss nan; rolled back to the checkpoint of "
        "step 3, learning rate x0.5"
    )
    for hostile in ({"reason": "x\x1b[2J"}, {"reason": "x" * 501}, {"lr_scale": 2.0},
                    {"action": "explode"}, {"step": -1}, {"extra": 1}):  # fmt: skip
        assert isinstance(parse_record(json.dumps({**line, **hostile}).encode()), RefusedRecord)


# -- the extension point, and a resume keeping the lowered rate --------------------------------


class Seen(LoopExtension):
    calls: list[tuple[int, str]] = []

    def on_instability(self, loop: Any, reason: str) -> None:
        Seen.calls.append((loop.state.step, reason))


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    real = ace3.runtime.build.compression_extensions
    monkeypatch.setattr(
        ace3.runtime.build, "compression_extensions", lambda *a: [*real(*a), Seen()]
    )
    Seen.calls = []
    return Seen.calls


def test_extensions_hear_of_each_instability_but_a_stop(
    seen: list[tuple[int, str]], tmp_path: Path
) -> None:
    result = train(NanAt(3), instability=ace3.InstabilityConfig(action="skip", window=1,
                                                                explosion_factor=1e6))  # fmt: skip
    assert [(r.step, r.action, r.reason) for r in result.instabilities] == [(3, "skip", "loss nan")]
    assert seen == [(2, "loss nan")]  # (before the skipped step counts)
    result = train(NanAt(5), tmp_path / "run", save_interval=2,
                   instability=ace3.InstabilityConfig(action="rollback", explosion_factor=1e6))  # fmt: skip
    assert seen[1:] == [(4, "loss nan")]  # after the rollback to step 4's checkpoint
    assert result.history["lr_scale"][-1] == (10, 0.5)
    seen.clear()
    with pytest.raises(ace3.InstabilityError, match="at step 2: loss nan"):
        train(NanAt(2), instability=ace3.InstabilityConfig(action="stop"))
    assert seen == []
    # A resume keeps the lowered rate (from the train state its checkpoint carries).
    resumed = train(NanAt(0), tmp_path / "resumed", resume=tmp_path / "run" / "step-00000006.pt")
    assert resumed.history["learning_rate"][0] == (8, 0.025)
    assert resumed.history["lr_scale"][0] == (8, 0.5)


# -- what the reports carry --------------------------------------------------------------------


def test_without_the_guard_the_norm_is_taken_at_report_steps_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken: list[int] = []
    real = Strategy.grad_norm

    def counting(self: Strategy, parts: Any) -> torch.Tensor:
        taken.append(parts.state.step + 1)
        return real(self, parts)

    monkeypatch.setattr(Strategy, "grad_norm", counting)
    result = train(NanAt(0))
    assert taken == [1, 4, 8, 10]  # the report steps (step 1, every 4, the epoch's last)
    reported = result.history["grad_norm"]
    assert [step for step, _ in reported] == taken and all(value > 0 for _, value in reported)
    names = set(result.history)
    assert {"memory_mb_rank0", "step_time_ms_rank0", "memory_mb_max", "step_time_ms_max",
            "peak_memory_mb_max"} <= names  # fmt: skip
    assert "tokens_per_sec" not in names  # float features are not token ids


def test_tokens_per_sec_counts_token_ids() -> None:
    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.out = nn.Embedding(50, 4), nn.Linear(4, 1)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out(self.embed(ids).mean(dim=1))

    ids = torch.randint(0, 50, (16, 6), generator=torch.Generator().manual_seed(0))
    config = ace3.TrainingConfig(**{**BASE, "log_interval": 2})
    result = ace3.Trainer(config).train(Bag(), TensorDataset(ids, torch.zeros(16, 1)))
    assert [step for step, _ in result.history["tokens_per_sec"]] == [1, 2, 4]
    assert all(value > 0 for _, value in result.history["tokens_per_sec"])
    # Every sample trained on (all 16: no validation split), each of its 6 token ids once.
    assert result.final_metrics["trained_tokens"] == 16 * 6


def test_trained_tokens_survive_a_resume_between_reports(tmp_path: Path) -> None:
    """A checkpoint saved between two metrics reports carries the tokens run since the first,
    so the resumed run's count equals the undisturbed one's."""
    from ace3.runtime.in_process import train_in_process

    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.out = nn.Embedding(50, 4), nn.Linear(4, 1)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out(self.embed(ids).mean(dim=1))

    ids = torch.randint(0, 50, (16, 6), generator=torch.Generator().manual_seed(0))
    data = TensorDataset(ids, torch.zeros(16, 1))
    config = ace3.TrainingConfig(**{**BASE, "epochs": 2, "log_interval": 100, "save_interval": 3})
    whole = train_in_process(config, Bag(), data, checkpoint_dir=tmp_path / "whole")
    assert whole.final_metrics["trained_tokens"] == 2 * 16 * 6
    step3 = tmp_path / "whole" / "step-00000003.pt"
    resumed = train_in_process(
        config, Bag(), data, checkpoint_dir=tmp_path / "resumed", resume_from=step3
    )
    assert resumed.final_metrics["trained_tokens"] == whole.final_metrics["trained_tokens"]


def test_token_counting_rule() -> None:
    ids = torch.ones(4, 7, dtype=torch.long)
    mask = torch.ones(4, 7, dtype=torch.long)
    mask[:, 5:] = 0
    assert count_tokens((ids, torch.zeros(4))) == 28
    assert count_tokens({"input_ids": ids, "attention_mask": mask}) == 20  # padding left out
    assert count_tokens({"input_ids": ids}) == 28
    assert count_tokens((torch.ones(4, 7), torch.zeros(4))) == 0  # features
    assert count_tokens((torch.ones(4, dtype=torch.long), torch.zeros(4))) == 0  # 1-D: not seqs


def test_per_rank_series_are_bounded() -> None:
    rows = [[100.0 + r, 200.0, 10.0 + (r == 2) * 5, -1.0, 0.0] for r in range(3)]
    values = per_rank_values(rows)
    assert values["memory_mb_rank2"] == 102.0 and values["step_time_ms_rank2"] == 15.0
    assert (values["step_time_ms_max"], values["step_time_ms_max_rank"]) == (15.0, 2.0)
    assert values["memory_mb_max_rank"] == 2.0 and "gpu_util_rank0" not in values
    many = per_rank_values([[1.0, 1.0, 1.0, 50.0 + r % 7, 0.0] for r in range(1024)])
    assert not [name for name in many if "_rank" in name and not name.endswith("max_rank")]
    assert len(many) <= 10 and many["gpu_util_min"] == 50.0
    assert len(per_rank_values([[1.0, 1.0, 1.0, 1.0, 0.0]] * MAX_RANKS_SHOWN)) > len(many)


def test_a_loss_scaler_s_overflow_is_no_spike_but_a_finite_spike_is() -> None:
    from ace3.runtime.loop.instability import InstabilityGuard
    from ace3.runtime.process.distributed import DistContext

    ctx = DistContext(
        rank=0, local_rank=0, world_size=1, backend="gloo", device=torch.device("cpu")
    )
    guard = InstabilityGuard(ace3.InstabilityConfig(action="skip", max_grad_norm_spike=100.0), ctx)
    loss = torch.tensor(1.0)
    # float16 overflow: the scaler skips the step and lowers its scale; the guard stays out
    assert guard.check(1, loss, torch.tensor(float("inf")), scaled=True) is None
    found = guard.check(2, loss, torch.tensor(float("inf")), scaled=False)
    assert found is not None and "grad_norm inf" in found.reason
    found = guard.check(3, loss, torch.tensor(500.0), scaled=True)
    assert found is not None and "max_grad_norm_spike" in found.reason
    assert guard.check(4, loss, torch.tensor(5.0), scaled=True) is None
