"""In-process training (``ace3.Trainer(config).train(module, dataset)``) on the real engine:
accumulation equivalence, AMP overflow skipping, bit-identical resume, out-of-memory recovery,
gradient checkpointing, schedules and callbacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import ace3


@pytest.fixture(scope="module")
def digits() -> TensorDataset:
    data = load_digits()
    inputs = torch.tensor(data.data / 16.0, dtype=torch.float32)
    return TensorDataset(inputs[:640], torch.tensor(data.target[:640], dtype=torch.int64))


def mlp(seed: int = 0, dropout: float = 0.0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(64, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 32), nn.ReLU(),
        nn.Linear(32, 10),
    )  # fmt: skip


def train(model: nn.Module, data: Any, **fields: Any) -> Any:
    trainer_args = fields.pop("trainer_args", {})
    config = ace3.TrainingConfig(**{"epochs": 2, "log_interval": 1, "seed": 3, **fields})
    return ace3.Trainer(config, **trainer_args).train(model, data)


def losses(result: Any) -> list[float]:
    return [value for _, value in result.history["train_loss"]]


def test_a_live_module_trains_in_process(digits: TensorDataset) -> None:
    model = mlp()
    result = train(model, digits, epochs=4, batch_size=32, learning_rate=1e-2)
    assert result.best_val_accuracy > 0.85
    assert result.model is model and result.job_id is None
    assert losses(result)[-1] < losses(result)[0]
    assert result.final_metrics["steps"] == 4 * 18  # 576 samples after the 10% hold-out


@pytest.mark.parametrize("dynamic_batch_size", [True, False])
def test_k_micro_batches_equal_one_batch_of_k_times_b(
    digits: TensorDataset, dynamic_batch_size: bool
) -> None:
    accumulated = train(
        mlp(), digits, batch_size=8, gradient_accumulation_steps=4,
        dynamic_batch_size=dynamic_batch_size,
    )  # fmt: skip
    whole = train(mlp(), digits, batch_size=32, dynamic_batch_size=dynamic_batch_size)
    assert len(losses(accumulated)) == len(losses(whole)) > 10
    for a, b in zip(losses(accumulated), losses(whole), strict=True):
        assert round(a, 5) == round(b, 5)
    assert accumulated.final_metrics["steps"] == whole.final_metrics["steps"]


class _InfiniteGradient(torch.autograd.Function):
    """The identity forward; inf/NaN gradients backward (a float16 overflow; the loss stays
    finite, so the run goes on: a non-finite loss would stop it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


class OverflowOnce(nn.Module):
    """An MLP whose gradients overflow in the training backward pass of one optimizer step."""

    def __init__(self, bad_forward: int) -> None:
        super().__init__()
        self.net = mlp()
        self.bad_forward = bad_forward
        self.forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if self.training:
            self.forwards += 1
            if self.forwards == self.bad_forward:
                out = _InfiniteGradient.apply(out)
        return out


def test_fp16_overflow_skips_exactly_that_step_and_backs_off(
    digits: TensorDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    model = OverflowOnce(bad_forward=3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = train(
        model, digits, epochs=1, batch_size=32, mixed_precision=True, amp_dtype="float16",
        init_loss_scale=1024.0, loss_scale_window=1000,
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "step 3: inf/nan gradients at loss scale 1024: step skipped, loss scale now 512" in (
        printed
    )
    assert printed.count("step skipped") == 1
    assert result.final_metrics["skipped_steps"] == 1
    assert result.final_metrics["loss_scale"] == 512.0
    scales = dict(result.history["loss_scale"])
    assert scales[2] == 1024.0 and scales[3] == 512.0
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_resume_is_bit_identical_in_process(digits: TensorDataset, tmp_path: Path) -> None:
    fields = dict(epochs=3, batch_size=32, dropout=0.2, save_interval=10)
    whole_model = mlp(dropout=0.2)
    train(whole_model, digits, **fields, trainer_args={
        "checkpoint_config": ace3.CheckpointConfig(save_dir=str(tmp_path / "whole"), save_interval=10)
    })  # fmt: skip
    interrupted = tmp_path / "whole" / "step-00000020.pt"
    assert interrupted.is_file()
    resumed_model = mlp(seed=99, dropout=0.2)  # different initial weights: all must come back
    trainer = ace3.Trainer(
        ace3.TrainingConfig(epochs=3, batch_size=32, dropout=0.2, seed=3, log_interval=1),
        checkpoint_config=ace3.CheckpointConfig(
            save_dir=str(tmp_path / "resumed"), save_interval=10
        ),
    )
    trainer.load_checkpoint(interrupted)
    result = trainer.train(resumed_model, digits, resume=True)
    assert min(step for step, _ in result.history["train_loss"]) == 21
    for (name, a), (_, b) in zip(
        whole_model.state_dict().items(), resumed_model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


class RealOOM(nn.Module):
    """Asks the real CPU allocator for ~9 TB when a batch holds more than ``limit`` samples."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.net = mlp()
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] > self.limit:
            torch.empty(9 * 2**40, dtype=torch.uint8)  # DefaultCPUAllocator: can't allocate
        return self.net(x)


def test_out_of_memory_halves_the_micro_batch_and_keeps_the_effective_batch(
    digits: TensorDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    recovered = train(RealOOM(limit=8), digits, batch_size=32, gradient_accumulation_steps=2)
    printed = capsys.readouterr().out
    assert "out of memory at step 1" in printed and "micro-batch 16" in printed
    assert "micro-batch 8 and 8 accumulation micro-steps" in printed
    assert recovered.final_metrics["micro_batch_split"] == 4
    reference = train(mlp(), digits, batch_size=32, gradient_accumulation_steps=2)
    assert recovered.final_metrics["steps"] == reference.final_metrics["steps"]
    for a, b in zip(losses(recovered), losses(reference), strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def test_out_of_memory_is_raised_when_dynamic_batch_size_is_off(digits: TensorDataset) -> None:
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        train(RealOOM(limit=8), digits, batch_size=32, dynamic_batch_size=False)


def test_gradient_checkpointing_gives_the_same_training(
    digits: TensorDataset, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = train(mlp(dropout=0.2), digits, batch_size=32)
    checkpointed = train(
        mlp(dropout=0.2), digits, batch_size=32, gradient_checkpointing=True, checkpoint_segments=3
    )
    assert "3 checkpointed segment(s)" in capsys.readouterr().out
    for a, b in zip(losses(plain), losses(checkpointed), strict=True):
        assert a == pytest.approx(b, abs=1e-6)


def test_gradient_checkpointing_refuses_a_model_it_cannot_split(digits: TensorDataset) -> None:
    class Opaque(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(64, 32), nn.Linear(32, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.relu(self.a(x)))

    with pytest.raises(ValueError, match="needs a checkpointable model"):
        train(Opaque(), digits, gradient_checkpointing=True)


def test_a_scheduler_built_on_the_client_drives_the_learning_rate(digits: TensorDataset) -> None:
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = ace3.schedulers.WarmupScheduler(optimizer, warmup_steps=10)
    result = train(model, digits, batch_size=32, trainer_args={"scheduler": scheduler})
    rates = [value for _, value in result.history["learning_rate"]]
    assert rates[0] == pytest.approx(0.01) and rates[9] == pytest.approx(0.1)
    assert rates[-1] == pytest.approx(0.1)


def test_callbacks_stop_training_and_see_the_model(digits: TensorDataset) -> None:
    seen: list[tuple[str, int]] = []

    class StopAfterTwo(ace3.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            seen.append(("epoch", epoch))
            assert "val_loss" in logs and "train_loss" in logs
            if epoch == 2:
                self.model.stop_training = True

    model = mlp()
    result = train(
        model, digits, epochs=5, batch_size=32, trainer_args={"callbacks": [StopAfterTwo()]}
    )
    assert seen == [("epoch", 1), ("epoch", 2)]
    assert result.final_metrics["epochs"] == 2
