"""Batch-size growth (``dynamic_batch_size=ace3.DynamicBatchSizeConfig(...)``): its settings
and refusals, the path in an in-process run's metrics (grow, shrink on out-of-memory and on
instability), the learning-rate rule, and a resume mid-path that follows the same path."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from torch.utils.data import TensorDataset

import ace3
from ace3.config.batch_growth import batch_growth
from ace3.runtime.loop.batch_growth import (
    BatchGrowth,
    concatenate_batches,
    grown,
    grown_path_steps,
    shrunk,
)
from ace3.runtime.loop.train_state import TrainState
from tests.loop_fakes import FakeLoop


def growth(**fields: Any) -> ace3.DynamicBatchSizeConfig:
    sizes = {"initial_batch_size": 8, "min_batch_size": 8, "target_batch_size": 32}
    return ace3.DynamicBatchSizeConfig(**{**sizes, "stable_steps": 2, **fields})


@pytest.fixture(scope="module")
def data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(200, 8, generator=generator)
    return TensorDataset(inputs, (inputs.sum(1) > 0).long())


class Net(nn.Module):
    """A tiny classifier; with ``oom_above`` its training forward asks the real CPU allocator
    for ~9 TB when a micro-batch holds more samples (a real out-of-memory error)."""

    def __init__(self, oom_above: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.oom_above = oom_above

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.oom_above is not None and x.shape[0] > self.oom_above:
            torch.empty(9 * 2**40, dtype=torch.uint8)
        return self.net(x)


def train(model: nn.Module, data: Any, trainer_args: dict[str, Any] | None = None, **fields: Any):
    config = ace3.TrainingConfig(
        **{"epochs": 2, "log_interval": 3, "validation_split": 0, "seed": 1, **fields}
    )
    return ace3.Trainer(config, **(trainer_args or {})).train(model, data)


def path_of(result: Any) -> dict[int, float]:
    """Step -> batch_size, from the run's metrics events."""
    return dict(result.history["batch_size"])


# -- settings -------------------------------------------------------------------------------
def test_settings_defaults_and_refusals_name_the_field() -> None:
    config = ace3.TrainingConfig(dynamic_batch_size=growth())
    assert config.batch_size == 8, "the loader's batch defaults to min_batch_size"
    assert ace3.unsupported_settings(config) == []
    again = ace3.TrainingConfig.model_validate_json(config.model_dump_json())
    assert again.dynamic_batch_size == config.dynamic_batch_size
    assert ace3.TrainingConfig(dynamic_batch_size={"min_batch_size": 4, "initial_batch_size": 4,
                                                   "target_batch_size": 8}).batch_size == 4  # fmt: skip
    assert ace3.TrainingConfig().dynamic_batch_size is True, "True keeps the OOM back-off alone"
    off = ace3.TrainingConfig(dynamic_batch_size=growth(enabled=False))
    assert batch_growth(off) is None and not off.dynamic_batch_size and off.batch_size == 32

    for fields, message in [
        ({"initial_batch_size": 4}, "initial_batch_size (4) must be >= min_batch_size (8)"),
        ({"target_batch_size": 4, "min_batch_size": 4, "initial_batch_size": 8},
         "target_batch_size (4) must be >= initial_batch_size (8)"),
        ({"initial_batch_size": 12}, "initial_batch_size (12) must be a multiple of min_batch"),
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"shrink_factor": 1.0}, "shrink_factor"),
        ({"stable_steps": 0}, "stable_steps"),
        ({"scale_learning_rate": "cubic"}, "scale_learning_rate"),
    ]:  # fmt: skip
        with pytest.raises(ValidationError, match=re.escape(message)):
            growth(**fields)

    refused = ace3.TrainingConfig(
        num_gpus=3, batch_size=18, gradient_accumulation_steps=2,
        dynamic_batch_size=growth(min_batch_size=4, initial_batch_size=4, target_batch_size=8),
    )  # fmt: skip
    fields = {p.field: p.reason for p in ace3.unsupported_settings(refused)}
    assert set(fields) == {"batch_size", "gradient_accumulation_steps",
                           "dynamic_batch_size.min_batch_size"}  # fmt: skip
    assert (
        "must be divisible by the 3 data-parallel replicas"
        in fields["dynamic_batch_size.min_batch_size"]
    )
    pipeline = ace3.TrainingConfig(
        parallelism="pipeline", num_stages=2, dynamic_batch_size=growth()
    )
    assert [p.field for p in ace3.unsupported_settings(pipeline)] == ["dynamic_batch_size"]


def test_sizes_round_to_whole_loader_batches_and_the_worker_allows_enough_halvings() -> None:
    from ace3_worker.outcome import max_micro_batch_halvings

    settings = growth(growth_factor=1.5, shrink_factor=0.3, target_batch_size=40)
    assert grown(8, settings, 40) == 16  # 12 rounds down to 8: one loader batch more at least
    assert grown(16, settings, 40) == 24 and grown(32, settings, 40) == 40
    assert grown(16, settings, 23) == 16, "never back to a size that ran out of memory"
    assert shrunk(40, settings) == 8 and shrunk(8, settings) == 8
    config = {"num_gpus": 2, "dynamic_batch_size": {"min_batch_size": 8, "initial_batch_size": 8,
                                                    "target_batch_size": 64}}  # fmt: skip
    assert max_micro_batch_halvings(config, 2) == 5  # the largest step: 32 per rank
    config["dynamic_batch_size"]["enabled"] = False  # type: ignore[index]
    assert max_micro_batch_halvings(config, 2) == 0


def test_concatenation_keeps_the_batch_structure() -> None:
    a = {"x": torch.zeros(2, 3), "pair": (torch.ones(2), torch.ones(2))}
    b = {"x": torch.ones(1, 3), "pair": (torch.zeros(1), torch.zeros(1))}
    (joined,) = concatenate_batches([a, b])
    assert joined["x"].shape == (3, 3) and joined["pair"][1].tolist() == [1, 1, 0]
    texts = [(torch.zeros(2), ["a", "b"]), (torch.zeros(2), ["c", "d"])]
    assert concatenate_batches(texts) == texts, "other leaves: separate micro-batches"


# -- the path in a run ------------------------------------------------------------------------
def test_the_effective_batch_follows_the_path_with_the_learning_rate_rule(
    data: TensorDataset,
) -> None:
    result = train(Net(), data, learning_rate=0.01,
                   dynamic_batch_size=growth(scale_learning_rate="linear"))  # fmt: skip
    # 25 loader batches of 8 per epoch: steps 1-2 take 1, steps 3-4 take 2, then 4 (the last
    # of the epoch 3): 9 steps, then 7 steps of 32.
    assert path_of(result) == {1: 8, 3: 16, 5: 32, 6: 32, 9: 32, 12: 32, 15: 32, 16: 32}
    assert result.final_metrics["steps"] == 16 and result.final_metrics["batch_size"] == 32
    assert dict(result.history["learning_rate"]) == pytest.approx(
        {1: 0.01, 3: 0.02, 6: 0.04, 9: 0.04, 12: 0.04, 15: 0.04, 16: 0.04}
    )
    # The schedule horizon follows the same path.
    assert grown_path_steps(growth(), 25, 2, None, TrainState()) == 16
    assert grown_path_steps(growth(), 25, 2, 12, TrainState()) == 12


def test_a_fixed_path_trains_like_the_plain_batch(data: TensorDataset) -> None:
    """A step of two concatenated loader batches of 8 is the plain run's batch of 16."""
    fixed = train(Net(), data, dynamic_batch_size=growth(initial_batch_size=16,
                                                         target_batch_size=16))  # fmt: skip
    plain = train(Net(), data, batch_size=16)
    assert fixed.final_metrics["steps"] == plain.final_metrics["steps"] == 26
    for (s1, a), (s2, b) in zip(fixed.history["train_loss"], plain.history["train_loss"],
                                strict=True):  # fmt: skip
        assert s1 == s2 and a == pytest.approx(b, abs=1e-6)


def test_out_of_memory_shrinks_and_the_path_stays_below_the_failed_size(
    data: TensorDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    result = train(Net(oom_above=16), data, epochs=1, log_interval=100,
                   dynamic_batch_size=growth(growth_factor=4))  # fmt: skip
    printed = capsys.readouterr().out
    # Step 3 runs 32 samples: out of memory, retried in place as 2 x 16; then 16, and the
    # growth stops at 24, below the size that failed.
    assert "out of memory at step 3 with micro-batch 32" in printed
    assert "batch size 32 -> 16 from step 4 (out of memory at batch size 32)" in printed
    assert "batch size 16 -> 24 from step 6" in printed
    assert path_of(result) == {1: 8, 3: 32, 4: 16, 6: 24, 10: 24}
    assert result.final_metrics["micro_batch_split"] == 2


def stand_in_loop(messages: list[str], state: TrainState, split: int = 1) -> FakeLoop:
    """The controller's view of a TrainingLoop (its log lines go to ``messages``)."""
    loop = FakeLoop(state, split=split)
    loop.logged = messages
    return loop


def test_the_attempt_after_an_out_of_memory_exit_starts_shrunk() -> None:
    """Several processes: the worker reruns the job from its newest checkpoint with
    micro_batch_split doubled per out-of-memory exit; the controller shrinks once per doubling
    since the checkpoint was written and stays below the checkpoint's size."""
    settings = growth(target_batch_size=64)
    config = ace3.TrainingConfig(dynamic_batch_size=settings)
    saved = TrainState(step=4, carry={"batch_growth": [64.0, 0.0, 64.0, 1.0]})
    messages: list[str] = []
    controller = BatchGrowth(settings, config)
    controller.start(stand_in_loop(messages, saved, split=2))
    assert (controller.position.size, controller.position.ceiling) == (32, 63)
    assert messages[0] == ("batch size 64 -> 32: an earlier attempt ran out of memory "
                           "(micro-batch split 2); it grows no further than 56")  # fmt: skip
    with controller.saving():
        assert saved.carry["batch_growth"] == [32.0, 0.0, 63.0, 2.0]
    again = BatchGrowth(settings, config)  # the checkpoint of that attempt, then split 4
    again.start(stand_in_loop([], saved, split=4))
    assert (again.position.size, again.position.ceiling) == (16, 31)
    fresh = BatchGrowth(settings, config)  # no checkpoint before the first exit
    fresh.start(stand_in_loop([], TrainState(), split=2))
    assert fresh.position.size == 8 and fresh.position.ceiling == 8


def test_instability_shrinks_and_restarts_the_count() -> None:
    messages: list[str] = []
    loop = stand_in_loop(messages, TrainState(step=7))
    controller = BatchGrowth(growth(initial_batch_size=32, scale_learning_rate="sqrt"),
                             ace3.TrainingConfig(dynamic_batch_size=growth()))  # fmt: skip
    controller.start(loop)
    controller.after_step(loop)
    controller.on_instability(loop, "loss 9.1 above 2 x its recent minimum")
    assert controller.position.size == 16 and controller.position.stable == 0
    assert messages[-1] == (
        "batch size 32 -> 16 from step 8 (instability: loss 9.1 above 2 x its recent minimum)"
    )
    assert controller.batches_per_step() == 2
    assert controller.lr_factor == pytest.approx(math.sqrt(0.5))  # what the loop's step takes
    for _ in range(2):
        controller.after_step(loop)
    assert controller.position.size == 32, "it grows again, up to the target"


def test_a_resume_mid_path_follows_the_same_path(data: TensorDataset, tmp_path: Path) -> None:
    fields = {"learning_rate": 0.01, "dynamic_batch_size": growth(scale_learning_rate="sqrt")}
    whole_model = Net()
    checkpoints = ace3.CheckpointConfig(save_dir=str(tmp_path / "whole"), save_interval=3)
    whole = train(whole_model, data, {"checkpoint_config": checkpoints}, **fields)
    interrupted = tmp_path / "whole" / "step-00000003.pt"  # at 16, one stable step of two
    saved = TrainState.from_checkpoint(torch.load(interrupted, weights_only=True))
    assert saved.carry["batch_growth"] == [16.0, 1.0, 32.0, 1.0]
    assert grown_path_steps(growth(), 25, 2, None, saved) == whole.final_metrics["steps"] == 16
    resumed_model = Net()
    with torch.no_grad():
        for p in resumed_model.parameters():
            p.add_(1.0)  # the checkpoint must bring every weight back
    trainer = ace3.Trainer(
        ace3.TrainingConfig(epochs=2, log_interval=3, validation_split=0, seed=1, **fields),
        checkpoint_config=ace3.CheckpointConfig(save_dir=str(tmp_path / "resumed")),
    )
    trainer.load_checkpoint(interrupted)
    resumed = trainer.train(resumed_model, data, resume=True)
    assert path_of(resumed) == {s: v for s, v in path_of(whole).items() if s > 3}
    assert path_of(resumed)[5] == 32
    assert dict(resumed.history["learning_rate"]) == {
        s: v for s, v in whole.history["learning_rate"] if s > 3
    }
    for (name, a), (_, b) in zip(
        whole_model.state_dict().items(), resumed_model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
