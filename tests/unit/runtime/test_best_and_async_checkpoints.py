"""keep_best_checkpoint (the best by a monitored metric survives pruning; refused where it
cannot be measured) and async_save (the state is staged, written in the background, recorded
only once the file is complete, and resumes bit-identically; a failed write fails the run)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import ace3
from ace3.config.events import CheckpointRecord
from ace3.files import sha256_file
from ace3.runtime import in_process
from ace3.runtime.checkpoint import background
from ace3.runtime.checkpoint.background import BackgroundSaveError, stage_to_cpu
from ace3.runtime.checkpoint.files import load_checkpoint


@pytest.fixture(scope="module")
def digits() -> TensorDataset:
    data = load_digits()
    inputs = torch.tensor(data.data / 16.0, dtype=torch.float32)
    return TensorDataset(inputs[:320], torch.tensor(data.target[:320], dtype=torch.int64))


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10))


def train(
    model: nn.Module, data: Any, save_dir: Path | None, resume: Path | None = None, **fields: Any
) -> Any:
    names = ace3.CheckpointConfig.model_fields if save_dir else {}
    checkpoint = {k: fields.pop(k) for k in list(fields) if k in names}
    config = ace3.TrainingConfig(
        **{"epochs": 2, "batch_size": 32, "seed": 3, "log_interval": 1, **fields}
    )
    trainer = ace3.Trainer(
        config,
        checkpoint_config=ace3.CheckpointConfig(save_dir=str(save_dir), **checkpoint)
        if save_dir
        else None,
    )
    if resume is not None:
        trainer.load_checkpoint(resume)
    return trainer.train(model, data, resume=resume is not None)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "shape"):  # numpy
        return bool((a == b).all())
    return bool(a == b)


def test_the_best_checkpoint_survives_pruning(digits: TensorDataset, tmp_path: Path) -> None:
    # mode="max" on val_loss: the first (untrained) checkpoint is the best, so the newer ones
    # are pruned around it. Checkpoints between epochs are validated for it.
    result = train(
        mlp(), digits, tmp_path, epochs=1, learning_rate=0.05, save_interval=3,
        max_checkpoints=1, keep_best=True, monitor="val_loss", mode="max",
    )  # fmt: skip
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step-00000003.pt", "step-00000009.pt"]  # best + newest
    assert result.best_checkpoint == tmp_path / "step-00000003.pt"
    assert [step for step, _ in result.history["val_loss"]] == [3, 6, 9]  # 9: the epoch's end
    # The best travels with the train state: a resumed run keeps comparing against it.
    assert load_checkpoint(tmp_path / "step-00000009.pt")["carry"]["best_checkpoint"][0] == 3


def test_a_monitor_the_job_cannot_measure_is_refused(digits: TensorDataset, tmp_path: Path) -> None:
    with pytest.raises(
        ace3.errors.UnsupportedFeatureError, match="no validation set to measure it"
    ):
        train(mlp(), digits, tmp_path, keep_best=True, validation_split=0.0)
    with pytest.raises(ace3.errors.UnsupportedFeatureError, match="does not produce it"):
        train(mlp(), digits, tmp_path, keep_best=True, monitor="val_f1", max_steps=2)
    with pytest.raises(ace3.errors.UnsupportedFeatureError, match="no checkpoint files"):
        train(mlp(), digits, None, async_save=True)
    # train_loss needs no validation set
    result = train(
        mlp(), digits, tmp_path / "t", keep_best=True, monitor="train_loss", validation_split=0.0,
        max_steps=3,
    )  # fmt: skip
    assert result.best_checkpoint == tmp_path / "t" / "step-00000003.pt"


def test_stage_to_cpu_copies_and_keeps_ties() -> None:
    weight = torch.ones(3)
    staged = stage_to_cpu({"a": weight, "b": [weight, (weight, 2)], "n": "x"})
    weight.add_(1.0)
    assert torch.equal(staged["a"], torch.ones(3))
    assert staged["a"] is staged["b"][0] is staged["b"][1][0] and staged["b"][1][1] == 2


def test_async_save_records_complete_files_and_resumes_bit_identically(
    digits: TensorDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = {"learning_rate": 0.05, "save_interval": 5}
    sync_model = mlp()
    sync = train(sync_model, digits, tmp_path / "sync", **fields)
    # A slow background write: the loop must go on, and no record may appear before the file.
    finished: set[str] = set()
    write = background.save_atomic

    def slow_write(state: dict[str, Any], path: Path) -> Any:
        assert threading.current_thread() is not threading.main_thread()
        time.sleep(0.2)
        saved = write(state, path)
        finished.add(path.name)
        return saved

    seen: list[CheckpointRecord] = []
    collect = in_process._Collector.__call__

    def watch(self: Any, record: Any) -> None:
        if isinstance(record, CheckpointRecord):
            assert record.name in finished  # the file is whole before its record
            assert sha256_file(record.path) == record.sha256
            seen.append(record)
        collect(self, record)

    monkeypatch.setattr(background, "save_atomic", slow_write)
    monkeypatch.setattr(in_process._Collector, "__call__", watch)
    async_model = mlp()
    result = train(async_model, digits, tmp_path / "async", async_save=True, **fields)
    assert [r.step for r in seen] == [5, 10, 15, 18]
    assert [r.epoch for r in seen] == [1, 2, 2, 2]  # as of the save's step, not the record's
    assert result.history["train_loss"] == sync.history["train_loss"]
    for name in ("step-00000010.pt", "step-00000018.pt"):
        a = load_checkpoint(tmp_path / "sync" / name)
        b = load_checkpoint(tmp_path / "async" / name)
        for key, value in a["model"].items():
            assert torch.equal(value, b["model"][key]), key
        assert a["optimizer"]["state"][0]["exp_avg"].equal(b["optimizer"]["state"][0]["exp_avg"])
        assert same(a["rng_per_rank"], b["rng_per_rank"]) and a["carry"] == b["carry"]
    monkeypatch.undo()
    # Resuming from the asynchronously written step 10 ends where the whole run ended.
    resumed = mlp()
    train(resumed, digits, tmp_path / "r", tmp_path / "async" / "step-00000010.pt", **fields)
    for (name, a), (_, b) in zip(
        sync_model.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_a_failed_background_write_fails_the_run(
    digits: TensorDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(state: dict[str, Any], path: Path) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(background, "save_atomic", broken)
    with pytest.raises(BackgroundSaveError, match="No space left on device"):
        train(mlp(), digits, tmp_path, async_save=True, save_interval=2, max_steps=6)


def test_async_sharded_checkpoint_resumes_like_a_synchronous_one(
    digits: TensorDataset, tmp_path: Path
) -> None:
    fields = {"learning_rate": 0.05, "zero_stage": 3, "max_steps": 6, "save_interval": 3}
    sync = train(mlp(), digits, tmp_path / "sync", **fields)
    done = train(mlp(), digits, tmp_path / "async", async_save=True, **fields)
    assert [p.name for p in done.checkpoints] == ["step-00000003.dcp.tar", "step-00000006.dcp.tar"]
    assert done.history["train_loss"] == sync.history["train_loss"]
    assert not [p for p in (tmp_path / "async").iterdir() if p.name.startswith(".")]
    resumed = mlp()
    train(resumed, digits, tmp_path / "r", tmp_path / "async" / "step-00000003.dcp.tar", **fields)
    for (name, a), (_, b) in zip(
        sync.model.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
