"""The run's plan (the ``start`` record) and a NaN/inf training loss (the ``nonfinite_loss``
record and :class:`ace3.NonFiniteLossError`), in process on the real engine with tiny models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import ace3
import ace3.runtime.in_process
from ace3.runtime.loop.metric_window import MetricWindow
from ace3.runtime.loop.step_counts import planned_total_steps
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.observe.reporting import EventWriter

# 50 samples: batch 4 gives 13 loader batches an epoch; accumulating 3 leaves a short last
# group of 1, so an epoch is 5 optimizer steps.
_inputs = torch.linspace(-1.0, 1.0, 200).reshape(50, 4)
DATA = TensorDataset(_inputs, _inputs.sum(dim=1, keepdim=True))
BASE = {"batch_size": 4, "gradient_accumulation_steps": 3, "epochs": 2, "validation_split": 0.0,
        "learning_rate": 0.01, "seed": 0, "log_interval": 4}  # fmt: skip


class Recorder:
    """Stands in for the in-process EventWriter: every run writes ``events-N.jsonl`` here, as
    rank 0 of a job writes ``output/events.jsonl``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.runs = 0

    def __call__(self, path: Path | None, enabled: bool, sink: Any = None) -> EventWriter:
        self.runs += 1
        return EventWriter(self.directory / f"events-{self.runs}.jsonl", enabled, sink)

    def events(self, of_type: str | None = None) -> list[dict[str, Any]]:
        """The last run's records (of one type)."""
        lines = (self.directory / f"events-{self.runs}.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        return [r for r in records if of_type is None or r["type"] == of_type]


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Recorder:
    recorder = Recorder(tmp_path)
    monkeypatch.setattr(ace3.runtime.in_process, "EventWriter", recorder)
    return recorder


def linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(4, 1)


class OutOfMemoryAbove(nn.Module):
    """Asks the CPU allocator for ~9 TB when a batch holds more than ``limit`` samples."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.net, self.limit = linear(), limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] > self.limit:
            torch.empty(9 * 2**40, dtype=torch.uint8)
        return self.net(x)


class BadLossAt(nn.Module):
    """Multiplies its output by ``factor`` (nan, inf) from training forward pass ``forward``."""

    def __init__(self, forward: int, factor: float) -> None:
        super().__init__()
        self.net, self.bad_forward, self.factor, self.forwards = linear(), forward, factor, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if self.training:
            self.forwards += 1
            if self.forwards >= self.bad_forward:
                out = out * self.factor
        return out


class _InfiniteGradient(torch.autograd.Function):
    """The identity forward; inf/NaN gradients backward: a float16 overflow, loss finite."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


class GradientOverflowAt(nn.Module):
    def __init__(self, forward: int) -> None:
        super().__init__()
        self.net, self.bad_forward, self.forwards = linear(), forward, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if self.training:
            self.forwards += 1
            if self.forwards == self.bad_forward:
                out = _InfiniteGradient.apply(out)
        return out


def train(model: nn.Module, save_dir: Path | None = None, **fields: Any) -> Any:
    config = ace3.TrainingConfig(**{**BASE, **fields})
    checkpoints = (
        ace3.CheckpointConfig(save_dir=str(save_dir), save_interval=fields.get("save_interval"))
        if save_dir is not None
        else None
    )
    return ace3.Trainer(config, checkpoint_config=checkpoints).train(model, DATA)


# -- the start record --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "make_model", "planned"),
    [
        ({}, linear, 10),  # 2 epochs of 4 groups of 3 micro-batches and 1 short group
        ({"epochs": 1, "gradient_accumulation_steps": 1}, linear, 13),
        ({"max_steps": 7}, linear, 7),
        # Out-of-memory recovery cuts each batch of 4 in two: more micro-steps, same steps.
        ({"epochs": 1}, lambda: OutOfMemoryAbove(limit=2), 5),
    ],
)
def test_start_record_plans_exactly_the_steps_the_run_takes(
    recorder: Recorder, fields: dict[str, Any], make_model: Any, planned: int
) -> None:
    result = train(make_model(), **fields)
    (start,) = recorder.events("start")
    assert start == {
        "type": "start", "total_steps": planned,
        "steps_per_epoch": 13 if fields.get("gradient_accumulation_steps") == 1 else 5,
        "epochs": fields.get("epochs", 2), "world_size": 1, "resumed_from_step": 0,
    }  # fmt: skip
    assert result.final_metrics["steps"] == planned
    assert recorder.events()[0]["type"] == "start"  # before the first step's metrics


def test_a_resumed_run_plans_from_step_zero(recorder: Recorder, tmp_path: Path) -> None:
    train(linear(), save_dir=tmp_path / "first", save_interval=4)
    checkpoint = tmp_path / "first" / "step-00000004.pt"  # mid-epoch 1: 12 of 13 batches done
    for accumulation, planned in [(3, 10), (2, 12)]:  # regrouped: 4 + 1 + ceil(13 / 2)
        trainer = ace3.Trainer(
            ace3.TrainingConfig(**{**BASE, "gradient_accumulation_steps": accumulation}),
            checkpoint_config=ace3.CheckpointConfig(save_dir=str(tmp_path / f"k{accumulation}")),
        )
        trainer.load_checkpoint(checkpoint)
        result = trainer.train(linear(), DATA, resume=True)
        (start,) = recorder.events("start")
        assert start["resumed_from_step"] == 4 and start["total_steps"] == planned
        assert result.final_metrics["steps"] == planned


@pytest.mark.parametrize(
    ("position", "max_steps", "planned"),
    [
        (TrainState(), None, 3 * 5),
        (TrainState(step=4, epoch=0, batch_in_epoch=12), None, 4 + 1 + 2 * 5),
        (TrainState(step=10, epoch=1, batch_in_epoch=13), None, 10 + 5),  # epoch closed
        (TrainState(step=15, epoch=3), None, 15),  # resumed after the last epoch
        (TrainState(step=9, epoch=1, batch_in_epoch=20), None, 9 + 5),  # more batches before
        (TrainState(step=4, epoch=0, batch_in_epoch=12), 6, 6),
        (TrainState(step=8, epoch=1, batch_in_epoch=9), 6, 8),  # max_steps already passed
    ],
)
def test_planned_total_steps_from_any_position(
    position: TrainState, max_steps: int | None, planned: int
) -> None:
    assert planned_total_steps(13, 3, 3, max_steps, position) == planned


# -- a non-finite training loss ---------------------------------------------------------------


def test_nan_loss_fails_the_run_with_the_step_where_it_began(recorder: Recorder) -> None:
    # Epoch 1 is 13 micro-batches in 5 steps: forward 14 is the first of step 6 (epoch 2).
    model = BadLossAt(forward=14, factor=float("nan"))
    with pytest.raises(ace3.NonFiniteLossError) as raised:
        train(model)
    message = str(raised.value)
    assert message == (
        "training loss became nan at step 6 (reported at step 8); lower the learning rate, "
        "enable gradient clipping (max_grad_norm) or loss scaling"
    )
    assert (raised.value.step, raised.value.reported_at_step) == (6, 8)
    (record,) = recorder.events("nonfinite_loss")
    assert record == {
        "type": "nonfinite_loss", "step": 6, "reported_at_step": 8, "epoch": 2,
        "metric": "train_loss", "value": "nan",
    }  # fmt: skip
    assert recorder.events()[-1] == record and not recorder.events("summary")


def test_inf_loss_stops_before_a_checkpoint_holds_it(recorder: Recorder, tmp_path: Path) -> None:
    # Inf from step 2; the next metrics report is at step 10, the save at step 3 comes first.
    model = BadLossAt(forward=2, factor=float("inf"))
    expected = r"^training loss became inf at step 2 \(reported at step 3\);"
    with pytest.raises(ace3.NonFiniteLossError, match=expected):
        train(
            model, save_dir=tmp_path / "saved", save_interval=3, log_interval=10,
            gradient_accumulation_steps=1,
        )  # fmt: skip
    assert recorder.events("nonfinite_loss")[0]["value"] == "inf"
    assert not list((tmp_path / "saved").glob("step-*"))
    assert not recorder.events("checkpoint")


def test_fp16_gradient_overflow_with_a_finite_loss_does_not_stop_the_run(
    recorder: Recorder, capsys: pytest.CaptureFixture[str]
) -> None:
    result = train(
        GradientOverflowAt(forward=4), mixed_precision=True, amp_dtype="float16",
        init_loss_scale=1024.0, epochs=1, gradient_accumulation_steps=1,
    )  # fmt: skip
    assert "step 4: inf/nan gradients at loss scale 1024: step skipped" in capsys.readouterr().out
    assert result.final_metrics["skipped_steps"] == 1 and result.final_metrics["steps"] == 13
    assert not recorder.events("nonfinite_loss")


# -- no host synchronisation per step ---------------------------------------------------------


def test_watching_the_loss_never_reads_it_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way a tensor's value reaches Python is refused while steps are added."""
    window = MetricWindow(torch.device("cpu"), rank=0, watch_nonfinite=True)
    losses = [1.0, 2.0, float("inf"), float("nan"), 3.0]

    def host_read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a per-step host read of a device tensor")

    with monkeypatch.context() as patch:
        for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu",
                     "numpy"):  # fmt: skip
            patch.setattr(torch.Tensor, name, host_read)
        for step, loss in enumerate(losses, start=1):
            window.add(torch.full((), loss), samples=4, step=step)
    sums = window.global_sums(world_size=1)
    assert sums.nonfinite is not None and (sums.nonfinite.step, sums.nonfinite.value) == (3, "inf")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_watching_the_loss_launches_no_cuda_synchronisation() -> None:
    device = torch.device("cuda")
    window = MetricWindow(device, rank=0, watch_nonfinite=True)
    losses = [torch.full((), value, device=device) for value in (1.0, float("nan"), 2.0)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step, loss in enumerate(losses, start=1):
            window.add(loss, samples=4, step=step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    nonfinite = window.global_sums(world_size=1).nonfinite
    assert nonfinite is not None and (nonfinite.step, nonfinite.value) == (2, "nan")


# -- what the events contract refuses ---------------------------------------------------------


def test_a_metric_name_the_contract_refuses_is_a_clear_error(recorder: Recorder) -> None:
    """compute_metrics names become val_<name>; one the worker would refuse stops the run at
    the first validation, naming the field, instead of losing the metrics silently."""
    from ace3.runtime.observe.reporting import EventRecordError

    def metrics(model: nn.Module, batch: Any) -> dict[str, float]:
        return {"x" * 300: 1.0}

    config = ace3.TrainingConfig(**{**BASE, "validation_split": 0.2})
    with pytest.raises(
        EventRecordError,
        match=r"metrics record: values\.val_x{56}\.\.\.\.\[key\]: String should have at most 200",
    ):
        ace3.runtime.in_process.train_in_process(config, linear(), DATA, compute_metrics=metrics)


def test_every_line_the_engine_prints_with_metrics_is_known_as_their_echo(capfd):
    """Plain progress prints each metric once: the display skips the engine's log echo of the
    metrics it prints itself, which it can only do if it recognises every such line."""
    from ace3.config.events import echoes_metrics

    config = ace3.TrainingConfig(**{**BASE, "validation_split": 0.25, "max_steps": 6})
    ace3.Trainer(config).train(linear(), DATA)
    lines = capfd.readouterr().out.splitlines()
    with_metrics = [line for line in lines if "loss=" in line or "accuracy=" in line]
    kinds = {line.split(" ")[0] for line in with_metrics}
    assert {"step", "epoch", "validation", "done:"} <= kinds, lines
    assert all(echoes_metrics(line) for line in with_metrics), with_metrics
    assert not any(echoes_metrics(line) for line in lines if line not in with_metrics)
