"""A dataset uploaded with ``records=`` (its row's batch layout names the kind) reaches the job
as ``DatasetSpec.records``, which the runtime reads its records as; a kind the first record told
(not named) is left for the job to tell again."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ace3.config.text_records import named_layout
from ace3.files import sha256_file
from ace3.runtime.job_spec import JobSpec
from ace3_control.storage import LocalArtifactStore
from ace3_worker.job_dir import prepare_job_directory


def _stored(store: LocalArtifactStore, tmp_path: Path, name: str, **more: Any) -> SimpleNamespace:
    source = tmp_path / name
    source.write_text(json.dumps({"text": "a b c"}) + "\n")
    key = f"stored/{name}"
    store.put_file(key, source)
    return SimpleNamespace(
        id=name, name=name, filename=name, storage_key=key, sha256=sha256_file(source),
        size_bytes=source.stat().st_size, kind="file", entry_module=None, factory="build_model",
        **more,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        (named_layout("text"), "text"),
        ({"kind": "records", "records": "text"}, None),  # (told by the first record)
        (None, None),
    ],
)
def test_the_named_kind_of_records_reaches_the_job_spec(
    tmp_path: Path, layout: dict[str, Any] | None, expected: str | None
) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    model = _stored(store, tmp_path, "model.py")
    data = _stored(store, tmp_path, "train.jsonl", batch_layout=layout)
    job = SimpleNamespace(id="job1", config={}, model_kwargs={}, micro_batch_halvings=0)
    (tmp_path / "work").mkdir()
    directory = prepare_job_directory(tmp_path / "work", store, job, 1, model, data, None, None)
    spec = json.loads(directory.job_file.read_text())
    assert spec["dataset"].get("records") == expected
    assert JobSpec.model_validate(spec).dataset.records == expected


def test_the_named_kind_of_streamed_records_reaches_the_job_spec(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    model = _stored(store, tmp_path, "model.py")
    manifest = {
        "uri": "s3://bucket/chats/", "format": "jsonl",
        "shards": [{"name": "0.jsonl", "size": 10, "etag": "e"}],
    }  # fmt: skip
    data = SimpleNamespace(
        id="d1", name="chats", kind="remote", manifest=manifest, batch_layout=named_layout("chat")
    )
    job = SimpleNamespace(id="job1", config={}, model_kwargs={}, micro_batch_halvings=0)
    (tmp_path / "work").mkdir()
    directory = prepare_job_directory(tmp_path / "work", store, job, 1, model, data, None, None)
    spec = JobSpec.model_validate(json.loads(directory.job_file.read_text()))
    assert spec.dataset.stream is not None and spec.dataset.records == "chat"
