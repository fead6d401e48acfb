"""Smaller runtime pieces: job spec, losses, precision, optimizers, samplers, evaluation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ace3.config import TrainingConfig
from ace3.runtime.build import override_dropout
from ace3.runtime.data.loaders import ShardSampler, SkipSampler
from ace3.runtime.job_spec import load_job_spec
from ace3.runtime.loop.evaluation import evaluate
from ace3.runtime.loop.losses import count_correct, default_loss, forward_loss
from ace3.runtime.loop.optim import build_optimizer
from ace3.runtime.loop.precision import resolve_precision
from ace3.runtime.loop.train_state import TrainState

JOB = {
    "job_id": "j1",
    "attempt": 2,
    "config": {"epochs": 2, "batch_size": 8},
    "model": {"path": "/x/model.py", "kind": "file", "entry_module": None,
              "factory": "build_model", "kwargs": {"hidden": 4}},
    "dataset": {"path": "/x/data.npz"},
    "validation_dataset": None,
    "output_dir": "/x/out",
    "resume_from": None,
}  # fmt: skip


def test_job_spec_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(JOB))
    job = load_job_spec(path)
    assert job.config.epochs == 2 and job.model.kwargs == {"hidden": 4} and job.attempt == 2
    assert job.resume_sha256 is None


def test_job_spec_is_strict(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps({**JOB, "extra_field": 1}))
    with pytest.raises(ValidationError):
        load_job_spec(path)
    path.write_text(json.dumps({**JOB, "config": {"epoch": 2}}))
    with pytest.raises(ValidationError):
        load_job_spec(path)
    path.write_text(json.dumps({**JOB, "resume_sha256": "abc"}))
    with pytest.raises(ValidationError):
        load_job_spec(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_job_spec(path)


def test_importing_runtime_package_does_not_import_torch() -> None:
    code = "import sys, ace3.runtime, ace3.config; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_default_losses() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    targets = torch.tensor([0, 1])
    expected = nn.functional.cross_entropy(logits, targets)
    assert torch.allclose(default_loss(logits, targets), expected)
    out = torch.tensor([[1.0], [3.0]])
    assert default_loss(out, torch.tensor([1.0, 1.0])).item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="do not match float targets"):
        default_loss(torch.zeros(2, 3), torch.zeros(2))


def test_forward_loss_paths() -> None:
    model = nn.Linear(2, 3)
    x, y = torch.randn(4, 2), torch.tensor([0, 1, 2, 0])
    result = forward_loss(model, (x, y), None)
    assert result.outputs is not None and result.loss.ndim == 0

    class WithLoss(nn.Module):
        def forward(self, inputs, labels=None):
            return SimpleNamespace(loss=inputs.sum() * 0 + 7.0)

    assert forward_loss(WithLoss(), (x, y), None).loss.item() == 7.0
    assert forward_loss(WithLoss(), {"inputs": x, "labels": y}, None).loss.item() == 7.0
    custom = forward_loss(model, [x], lambda m, b: m(b[0]).mean())
    assert custom.outputs is None
    with pytest.raises(ValueError, match=r"expected \(inputs, targets\) batches"):
        forward_loss(model, (x, y, y), None)
    with pytest.raises(ValueError, match="scalar loss"):
        forward_loss(model, (x, y), lambda m, b: m(b[0]))


def test_compute_loss_returning_outputs_keeps_val_accuracy() -> None:
    model = nn.Linear(2, 3)
    x, y = torch.randn(4, 2), torch.tensor([0, 1, 2, 0])

    def compute_loss(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):
        logits = m(batch[0])
        return nn.functional.cross_entropy(logits, batch[1]), logits

    result = forward_loss(model, (x, y), compute_loss)
    assert result.loss.ndim == 0 and result.outputs is not None and result.targets is y
    assert count_correct(result.outputs, result.targets) is not None
    only_loss = forward_loss(model, (x, y), lambda m, b: compute_loss(m, b)[0])
    assert only_loss.outputs is None, "without outputs there is nothing to score accuracy on"


def test_count_correct() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0]])
    assert count_correct(logits, torch.tensor([0, 1, 1])) == 2
    assert count_correct(logits, torch.tensor([0.0, 1.0, 1.0])) is None
    assert count_correct(torch.zeros(3, 1), torch.tensor([0, 0, 0])) is None


def test_precision_choices() -> None:
    cpu = torch.device("cpu")
    off = resolve_precision(TrainingConfig(), cpu)
    assert not off.enabled and not off.make_scaler().is_enabled()
    o0 = resolve_precision(TrainingConfig(mixed_precision=True, amp_level="O0"), cpu)
    assert not o0.enabled
    auto = resolve_precision(TrainingConfig(mixed_precision=True), cpu)
    assert auto.dtype == torch.bfloat16 and not auto.make_scaler().is_enabled()
    with auto.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    fp16 = resolve_precision(TrainingConfig(mixed_precision=True, amp_dtype="float16"), cpu)
    assert fp16.dtype == torch.float16 and fp16.needs_scaler  # float16 scales on any device
    assert fp16.make_scaler().is_enabled()


def test_optimizers() -> None:
    params = list(nn.Linear(2, 2).parameters())
    adamw = build_optimizer(params, TrainingConfig(weight_decay=0.1))
    assert isinstance(adamw, torch.optim.AdamW) and adamw.param_groups[0]["weight_decay"] == 0.1
    sgd = build_optimizer(params, TrainingConfig(optimizer="sgd", momentum=0.5))
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.5
    assert isinstance(build_optimizer(params, TrainingConfig(optimizer="adam")), torch.optim.Adam)


def test_dropout_override() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5), nn.Sequential(nn.Dropout2d(0.2)))
    assert override_dropout(model, 0.0) == 2
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd))
    assert override_dropout(model, None) == 0


def test_samplers() -> None:
    shards = [list(ShardSampler(10, r, 3)) for r in range(3)]
    assert sorted(i for shard in shards for i in shard) == list(range(10))
    assert [len(ShardSampler(10, r, 3)) for r in range(3)] == [4, 3, 3]
    skip = SkipSampler(ShardSampler(10, 0, 1), 4)
    assert list(skip) == list(range(4, 10)) and len(skip) == 6


def test_evaluate_single_process_is_exact() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    model = nn.Linear(3, 2)
    loader = DataLoader(TensorDataset(x, y), batch_size=3, sampler=ShardSampler(10, 0, 1))
    user = SimpleNamespace(compute_loss=None, compute_metrics=lambda m, b: {"ones": 1.0})
    precision = resolve_precision(TrainingConfig(), torch.device("cpu"))
    metrics = evaluate(model, loader, torch.device("cpu"), precision, user)  # type: ignore[arg-type]
    with torch.no_grad():
        logits = model(x)
    assert metrics["val_loss"] == pytest.approx(nn.functional.cross_entropy(logits, y).item())
    assert metrics["val_accuracy"] == pytest.approx((logits.argmax(1) == y).float().mean().item())
    assert metrics["val_ones"] == pytest.approx(1.0)


def test_train_state_epochs_and_best() -> None:
    state = TrainState()
    assert state.display_epoch() == 1
    state.batch_in_epoch = 3
    assert state.display_epoch() == 1
    state.epoch, state.batch_in_epoch = 1, 0
    assert state.display_epoch() == 1
    state.record({"val_accuracy": 0.5})
    state.record({"val_accuracy": 0.4})
    assert state.best_val_accuracy == 0.5
    again = TrainState.from_checkpoint(state.to_checkpoint())
    assert again == state
