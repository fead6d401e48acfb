"""``ace3.save_checkpoint`` / ``ace3.load_checkpoint`` and the in-process keep-last-N pruning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ace3
from ace3.runtime.checkpoint.files import prune_checkpoint_files


def test_save_is_atomic_and_load_round_trips(tmp_path: Path) -> None:
    state = {"epoch": 2, "weights": torch.arange(6.0).reshape(2, 3), "name": "x"}
    path = ace3.save_checkpoint(state, tmp_path / "sub" / "ckpt.pt")
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == ["ckpt.pt"]
    loaded = ace3.load_checkpoint(path)
    assert loaded["epoch"] == 2 and loaded["name"] == "x"
    assert torch.equal(loaded["weights"], state["weights"])


def test_safetensors_round_trip_and_refuses_nested_state(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")
    weights = torch.nn.Linear(3, 2).state_dict()
    path = ace3.save_checkpoint(weights, tmp_path / "model.safetensors")
    loaded = ace3.load_checkpoint(path)
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())
    with pytest.raises(TypeError, match="flat dict of str -> tensor"):
        ace3.save_checkpoint({"model": weights}, tmp_path / "nested.safetensors")


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="checkpoint file not found"):
        ace3.load_checkpoint(tmp_path / "nope.pt")


def test_keep_last_n_never_deletes_the_newest(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        (tmp_path / f"step-{step:08d}.pt").write_bytes(b"x")
    (tmp_path / "other.pt").write_bytes(b"y")
    deleted = prune_checkpoint_files(tmp_path, keep=2)
    assert sorted(p.name for p in deleted) == ["step-00000005.pt", "step-00000010.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "other.pt", "step-00000015.pt", "step-00000020.pt",
    ]  # fmt: skip
    prune_checkpoint_files(tmp_path, keep=0)  # even a bad value keeps the newest
    assert (tmp_path / "step-00000020.pt").exists()
