"""A resumed attempt of a LoRA job gets the weights it started from (``init_from``) again: its
checkpoints hold the adapters alone, so the base comes back from those weights. Any other
resumed attempt does without them (its checkpoint holds every weight)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ace3.files import sha256_file
from ace3_control.storage import LocalArtifactStore
from ace3_control.stored_weights import StoredWeights
from ace3_worker.job_dir import prepare_job_directory


def _stored(store: LocalArtifactStore, tmp_path: Path, name: str, key: str) -> SimpleNamespace:
    source = tmp_path / name
    source.write_bytes(name.encode() * 10)
    store.put_file(key, source)
    return SimpleNamespace(
        id=name, name=name, filename=name, storage_key=key, sha256=sha256_file(source),
        size_bytes=source.stat().st_size, kind="file", entry_module=None, factory="build_model",
    )  # fmt: skip


@pytest.mark.parametrize("config", [{}, {"lora": {"target_modules": ["0"]}}])
def test_a_resumed_lora_attempt_gets_its_initial_weights_again(
    tmp_path: Path, config: dict[str, Any]
) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    model = _stored(store, tmp_path, "model.py", "models/o/m/model.py")
    data = _stored(store, tmp_path, "data.npz", "datasets/o/d/data.npz")
    resume = _stored(store, tmp_path, "step-00000006.pt", "checkpoints/j/step-6.pt")
    initial = _stored(store, tmp_path, "pretrained.pt", "checkpoints/k/pretrained.pt")
    weights = StoredWeights(initial.id, initial.name, initial.storage_key, initial.sha256, 1)
    job = SimpleNamespace(id="job1", config=config, model_kwargs={}, micro_batch_halvings=0)
    (tmp_path / "work").mkdir()
    directory = prepare_job_directory(
        tmp_path / "work",
        store,
        job,
        2,
        model,
        data,
        None,
        resume,
        init_from=weights,  # type: ignore[arg-type]
    )
    spec = json.loads(directory.job_file.read_text())
    assert spec["resume_from"] is not None
    if config:
        assert Path(spec["init_from"]).read_bytes() == (tmp_path / "pretrained.pt").read_bytes()
        assert spec["init_from_sha256"] == initial.sha256
    else:
        assert spec["init_from"] is None
