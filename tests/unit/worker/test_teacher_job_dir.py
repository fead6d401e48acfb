"""A distillation job's directory holds its teacher: the teacher's model code and weights copied
into the read-only ``teacher/``, verified against their sha256, named by ``job.json``'s
``teacher`` entry (which the engine's JobSpec accepts)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from ace3.files import sha256_file
from ace3.runtime.job_spec import JobSpec
from ace3_control.storage import LocalArtifactStore
from ace3_control.stored_weights import StoredWeights
from ace3_worker.job_dir import InputCorruptedError, prepare_job_directory
from ace3_worker.teacher_inputs import TeacherRows


def _stored(store: LocalArtifactStore, tmp_path: Path, name: str, key: str) -> SimpleNamespace:
    source = tmp_path / name
    source.write_bytes(name.encode() * 10)
    store.put_file(key, source)
    return SimpleNamespace(
        id=name, name=name, filename=name, storage_key=key, sha256=sha256_file(source),
        size_bytes=source.stat().st_size, kind="file", entry_module=None, factory="build_model",
    )  # fmt: skip


def _prepare(tmp_path: Path, weights_sha256: str | None = None) -> Path:
    store = LocalArtifactStore(tmp_path / "store")
    model = _stored(store, tmp_path, "student.py", "models/o/s/model.py")
    data = _stored(store, tmp_path, "data.npz", "datasets/o/d/data.npz")
    teacher = _stored(store, tmp_path, "teacher.py", "models/o/t/model.py")
    stored = _stored(store, tmp_path, "teacher.safetensors", "checkpoints/u/w.safetensors")
    weights = StoredWeights(
        stored.id, "weights.safetensors", stored.storage_key, weights_sha256 or stored.sha256, 1
    )
    config = {"distillation": {"teacher_model_id": "teacher.py", "teacher_checkpoint_id": "w"}}
    job = SimpleNamespace(id="job1", config=config, model_kwargs={}, micro_batch_halvings=0)
    (tmp_path / "work").mkdir()
    directory = prepare_job_directory(
        tmp_path / "work", store, job, 1, model, data, None, None,  # type: ignore[arg-type]
        teacher=TeacherRows(teacher, weights, {"hidden": 64}),  # type: ignore[arg-type]
    )  # fmt: skip
    return directory.job_file


def test_the_teacher_is_copied_read_only_and_named_by_job_json(tmp_path: Path) -> None:
    job_file = _prepare(tmp_path)
    spec = JobSpec.model_validate(json.loads(job_file.read_text()))
    assert spec.teacher is not None and spec.teacher.model.kwargs == {"hidden": 64}
    code, weights = Path(spec.teacher.model.path), Path(spec.teacher.checkpoint or "")
    assert code.read_bytes() == (tmp_path / "teacher.py").read_bytes()
    assert weights.read_bytes() == (tmp_path / "teacher.safetensors").read_bytes()
    assert spec.teacher.checkpoint_sha256 == sha256_file(weights)
    assert code.parent.parent == job_file.parent / "teacher"
    for path in (code, weights):
        assert not os.access(path, os.W_OK) or os.geteuid() == 0
        assert path.stat().st_mode & 0o222 == 0


def test_teacher_weights_that_no_longer_match_their_sha256_fail_the_attempt(
    tmp_path: Path,
) -> None:
    with pytest.raises(InputCorruptedError, match="do not match their recorded sha256"):
        _prepare(tmp_path, weights_sha256="0" * 64)
