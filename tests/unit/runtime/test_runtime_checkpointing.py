"""Checkpoint files: atomic save, sha256, weights_only load, pruning, RNG round trip."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from ace3.runtime.checkpoint.files import (
    checkpoint_name,
    load_checkpoint,
    save_atomic,
)
from ace3.runtime.loop.rng import capture_rng, restore_rng


def _state(step: int) -> dict:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": {},
        "step": step,
        "epoch": 0,
        "batch_in_epoch": step,
        "rng": capture_rng(),
    }


def test_save_is_atomic_and_hashed(tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / checkpoint_name(12)
    saved = save_atomic(_state(12), path)
    assert path.name == "step-00000012.pt"
    assert saved.path == path.resolve()
    assert saved.size_bytes == path.stat().st_size
    assert saved.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left


def test_load_weights_only_and_verify(tmp_path: Path) -> None:
    path = tmp_path / checkpoint_name(3)
    state = _state(3)
    saved = save_atomic(state, path)
    loaded = load_checkpoint(path, saved.sha256.upper())
    assert loaded["step"] == 3
    for key, value in state["model"].items():
        assert torch.equal(loaded["model"][key], value)
    # plain torch.load with weights_only=True works too (the documented contract)
    assert torch.load(path, weights_only=True)["batch_in_epoch"] == 3
    with pytest.raises(ValueError, match="sha256"):
        load_checkpoint(path, "0" * 64)


def test_failed_save_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / checkpoint_name(1)
    with pytest.raises(Exception):  # noqa: B017 - torch raises a pickling error type
        save_atomic({"model": {}, "step": 1, "bad": lambda: None}, path)
    assert list(tmp_path.iterdir()) == []


def test_load_rejects_non_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    torch.save({"weights": torch.zeros(1)}, path)
    with pytest.raises(ValueError, match="not an ACE3 checkpoint"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_rng_round_trip_through_weights_only(tmp_path: Path) -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # leaves a cached gaussian state
    state = capture_rng()
    torch.save(state, tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert random.random() == expected[0]
    assert np.random.rand() == expected[1]
    assert torch.equal(torch.rand(3), expected[2])
