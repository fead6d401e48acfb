"""Snippets of the ACE3 document that run without the service: each one as written, then a
check of what its section claims."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import ace3
from tests.conformance.snippets import run_snippet

# Headings covered by this file (tests/conformance/test_coverage.py checks the union).
COVERED = {
    "Gradient Scaling",
    "Memory-Efficient Optimizers",
    "Dynamic Loss Scaling",
    "Manual Checkpointing",
    "Data Loading",
    "Out of Memory Errors",
    "Slow Training",
    "Training Instability",
}


def _fixed_batch(live: dict[str, Any], size: int = 64) -> tuple[Any, Any]:
    inputs, targets = live["dataset"].tensors
    return inputs[:size], targets[:size]


def test_gradient_scaling(live_names: dict[str, Any], tmp_path: Path) -> None:
    torch = live_names["torch"]
    net = live_names["model"]

    class ModelReturningLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, batch: Any) -> Any:
            inputs, targets = batch
            return torch.nn.functional.cross_entropy(self.net(inputs), targets)

    model = ModelReturningLoss()
    batch = _fixed_batch(live_names)
    dataloader = [batch] * 15
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with torch.no_grad():
        before = float(model(batch))
    names = run_snippet(
        "Gradient Scaling", tmp_path,
        {**live_names, "model": model, "dataloader": dataloader, "optimizer": optimizer},
    )  # fmt: skip
    scaler = names["scaler"]
    assert isinstance(scaler, ace3.GradientScaler)
    assert scaler.get_scale() == 65536.0  # no overflow, growth interval (2000) not reached
    assert scaler.skipped_steps == 0
    assert optimizer.state[next(iter(model.parameters()))]["step"] == 15
    with torch.no_grad():
        assert float(model(batch)) < before  # the scaled, unscaled-then-stepped grads trained


def test_dynamic_loss_scaling(live_names: dict[str, Any], tmp_path: Path) -> None:
    torch = live_names["torch"]
    model = live_names["model"]
    inputs, targets = _fixed_batch(live_names)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = torch.nn.CrossEntropyLoss()
    with torch.no_grad():
        before = float(criterion(model(inputs), targets))
    names = run_snippet(
        "Dynamic Loss Scaling", tmp_path,
        {**live_names, "dataloader": [inputs] * 15, "targets": targets,
         "optimizer": optimizer, "criterion": criterion},
    )  # fmt: skip
    scaler = names["loss_scaler"]
    assert isinstance(scaler, ace3.DynamicLossScaler)
    assert scaler.get_scale() == 2.0**16 and scaler.skipped_steps == 0
    with torch.no_grad():
        assert float(criterion(model(inputs), targets)) < before


def test_memory_efficient_optimizers(live_names: dict[str, Any], tmp_path: Path) -> None:
    torch = live_names["torch"]
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )  # fmt: skip
    names = run_snippet("Memory-Efficient Optimizers", tmp_path, {**live_names, "model": model})
    assert isinstance(names["optimizer"], ace3.optimizers.Adam8bit)
    inputs, targets = _fixed_batch(live_names)
    state_bytes = {}
    for make in (
        lambda p: torch.optim.Adam(p, lr=1e-4),
        lambda p: ace3.optimizers.MemoryEfficientAdam(p, lr=1e-4, weight_decay=0.01),
        lambda p: ace3.optimizers.Adam8bit(p, lr=1e-4),
    ):
        optimizer = make(model.parameters())
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state_bytes[type(optimizer).__name__] = ace3.optimizers.optimizer_state_bytes(optimizer)
    adam = state_bytes["Adam"]
    assert state_bytes["MemoryEfficientAdam"] <= adam / 2, state_bytes
    assert state_bytes["Adam8bit"] <= adam / 3, state_bytes


def test_manual_checkpointing(live_names: dict[str, Any], tmp_path: Path) -> None:
    torch = live_names["torch"]
    model = live_names["model"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = ace3.schedulers.CosineAnnealingLR(optimizer, T_max=100)
    inputs, targets = _fixed_batch(live_names)
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    scheduler.step()
    names = run_snippet(
        "Manual Checkpointing", tmp_path,
        {**live_names, "optimizer": optimizer, "scheduler": scheduler, "epoch": 3,
         "loss": loss.detach(), "accuracy": 0.5},
    )  # fmt: skip
    path = tmp_path / "checkpoints" / "manual_checkpoint.pt"
    assert path.is_file() and not list(path.parent.glob(".*tmp*"))  # atomic: no leftovers
    loaded = names["checkpoint"]
    assert loaded["epoch"] == 3 and loaded["accuracy"] == 0.5
    for key, value in model.state_dict().items():
        assert torch.equal(loaded["model_state_dict"][key], value)
    assert loaded["scheduler_state_dict"]["last_epoch"] == 1
    # Loading never runs pickled code: a file holding an arbitrary object is refused.
    evil = tmp_path / "evil.pt"
    torch.save({"x": _Unsafe()}, evil)
    with pytest.raises(ValueError, match="weights-only"):
        ace3.load_checkpoint(evil)


class _Unsafe:
    def __reduce__(self) -> Any:
        return (print, ("pickled code ran",))


def test_data_loading(live_names: dict[str, Any], tmp_path: Path) -> None:
    names = run_snippet("Data Loading", tmp_path, live_names)
    dataloader = names["dataloader"]
    inputs, targets = next(iter(dataloader))
    assert inputs.shape == (32, 64) and targets.shape == (32,)
    import torch

    assert dataloader.pin_memory is torch.cuda.is_available()  # honoured only with CUDA
    assert dataloader.num_workers >= 1


def test_out_of_memory_errors(tmp_path: Path) -> None:
    names = run_snippet(
        "Out of Memory Errors", tmp_path, {"ace3": ace3, "config": ace3.TrainingConfig()}
    )
    config = names["config"]
    assert (config.batch_size, config.gradient_checkpointing) == (16, True)
    assert (config.cpu_offload, config.mixed_precision) == (True, True)
    # Each assignment is validated: a wrong value keeps the old one and names the field.
    with pytest.raises(ValueError, match="batch_size"):
        config.batch_size = 0
    assert config.batch_size == 16


def test_slow_training(live_names: dict[str, Any], tmp_path: Path, capsys) -> None:
    dataloader = ace3.DataLoader(live_names["dataset"], batch_size=64, shuffle=False)
    names = run_snippet(
        "Slow Training", tmp_path,
        {**live_names, "dataloader": dataloader, "config": ace3.TrainingConfig()},
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "batches/s" in printed or "samples/s" in printed
    optimized = names["dataloader"]
    assert optimized is not dataloader
    import torch

    for (a, b), (c, d) in zip(dataloader, optimized, strict=True):
        assert torch.equal(a, c) and torch.equal(b, d)  # same batches, in the same order
    assert names["config"].num_gpus == 4 and names["config"].mixed_precision


def test_training_instability(live_names: dict[str, Any], tmp_path: Path) -> None:
    torch = live_names["torch"]
    optimizer = torch.optim.AdamW(live_names["model"].parameters(), lr=1e-3)
    names = run_snippet(
        "Training Instability", tmp_path,
        {**live_names, "optimizer": optimizer, "config": ace3.TrainingConfig()},
    )  # fmt: skip
    config = names["config"]
    assert (config.max_grad_norm, config.learning_rate) == (1.0, 1e-5)
    assert (config.weight_decay, config.dropout) == (0.01, 0.1)
    scheduler = names["scheduler"]
    lrs = []
    for _ in range(3):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] < lrs[1] < lrs[2] <= 1e-3  # linear warmup over 1000 steps
    assert json.dumps(scheduler.to_spec().model_dump())  # carried to a remote job by value
