"""A succeeded run's export (``artifacts/huggingface/``, as the artifact sync stored it) becomes a
model of the job's owner in the transaction that marks the job ``succeeded``
(ace3_worker.export_registration through OutcomeWriter.record), on a real (SQLite) database
migrated to head and a local store."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobArtifact, JobState, StoredModel
from ace3_control.settings import Settings
from ace3_control.storage import LocalArtifactStore
from ace3_server.migrations_check import upgrade
from ace3_worker.export_registration import ExportRegistrar, StoreOutage
from ace3_worker.outcome_writer import OutcomeWriter
from tests.conftest import insert_job

CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_positions": 32}


def _safetensors(tensors: dict[str, list[int]]) -> bytes:
    """A safetensors file of zero-filled float32 tensors."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in tensors.items():
        count = 1
        for size in shape:
            count *= size
        header[name] = {
            "dtype": "F32",
            "shape": shape,
            "data_offsets": [offset, offset + 4 * count],
        }
        offset += 4 * count
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


EXPORT = {
    "huggingface/config.json": json.dumps(CONFIG).encode(),
    "huggingface/model.safetensors": _safetensors({"h.0.attn.weight": [2, 3], "wte.weight": [5]}),
    "huggingface/tokenizer_config.json": b"{}",
}


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    url = Settings(data_dir=tmp_path).resolved_database_url
    upgrade(url)
    return sync_session_factory(make_sync_engine(url))


@pytest.fixture
def store(tmp_path: Path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "store")


def _job(
    session: Session, store: LocalArtifactStore, files: dict[str, bytes], kind: str = "huggingface"
) -> Job:
    """A running attempt 1 of a job on a model of ``kind`` whose artifact sync stored
    ``files``."""
    job: Job = insert_job(session, state=JobState.RUNNING, attempt=1)
    model = session.get(StoredModel, job.model_id)
    assert model is not None
    model.kind, model.name = kind, "tiny-gpt2"
    for path, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        key = f"job-artifacts/{job.id}/{digest}"
        source = store.staging_dir() / digest
        source.write_bytes(data)
        store.put_file(key, source)
        session.add(
            JobArtifact(
                job_id=job.id, path=path, attempt=1, size_bytes=len(data), sha256=digest,
                storage_key=key,
            )
        )  # fmt: skip
    session.commit()
    return job


def _writer(settings_dir: Path, sessions: sessionmaker[Session], store: LocalArtifactStore) -> Any:
    return OutcomeWriter(Settings(data_dir=settings_dir), sessions, ExportRegistrar(store))


def test_a_succeeded_export_is_registered_with_the_job(
    tmp_path: Path, sessions: sessionmaker[Session], store: LocalArtifactStore
) -> None:
    with sessions() as session:
        job_id = _job(session, store, EXPORT).id
    _writer(tmp_path, sessions, store).record(job_id, 1, JobState.SUCCEEDED, exit_code=0)
    with sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.SUCCEEDED
        model = session.get(StoredModel, job.fine_tuned_model_id)
        assert model is not None and model.owner_id == job.owner_id
        assert (model.kind, model.factory, model.source_job_id) == (
            "huggingface",
            "from_pretrained",
            job_id,
        )
        assert model.name == f"tiny-gpt2-ft-{job_id}"
        assert model.architectures == ["GPT2LMHeadModel"] and model.parameter_count == 11
        assert model.module_names == ["h.0.attn", "wte"]
        fetched = store.fetch(model.storage_key, tmp_path / "fetched", sha256=model.tree_sha256)
        assert sorted(p.name for p in fetched.iterdir()) == [
            "config.json",
            "model.safetensors",
            "tokenizer_config.json",
        ]
        # The same bytes exported again by another job of the owner are the same model.
        again = _job(session, store, EXPORT)
        again.owner_id = job.owner_id
        session.commit()
        again_id, first_model = again.id, model.id
    _writer(tmp_path, sessions, store).record(again_id, 1, JobState.SUCCEEDED, exit_code=0)
    with sessions() as session:
        assert session.get(Job, again_id).fine_tuned_model_id == first_model  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({"huggingface/config.json": b"{}"}, "model_type"),
        ({k: v for k, v in EXPORT.items() if "safetensors" not in k}, "safetensors"),
    ],
)
def test_an_export_that_cannot_be_a_model_fails_the_job_saying_why(
    tmp_path: Path,
    sessions: sessionmaker[Session],
    store: LocalArtifactStore,
    files: dict[str, bytes],
    reason: str,
) -> None:
    with sessions() as session:
        job_id = _job(session, store, files).id
        models_before = session.scalar(select(func.count()).select_from(StoredModel))
    _writer(tmp_path, sessions, store).record(job_id, 1, JobState.SUCCEEDED, exit_code=0)
    with sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.FAILED
        assert job.error is not None and "cannot be registered as a model" in job.error
        assert reason in job.error and job.fine_tuned_model_id is None
        assert session.scalar(select(func.count()).select_from(StoredModel)) == models_before


def test_stored_bytes_that_changed_fail_the_job_naming_the_file(
    tmp_path: Path, sessions: sessionmaker[Session], store: LocalArtifactStore
) -> None:
    with sessions() as session:
        job_id = _job(session, store, EXPORT).id
        row = session.scalar(
            select(JobArtifact).where(JobArtifact.path == "huggingface/config.json")
        )
        assert row is not None
        row.sha256 = "0" * 64
        session.commit()
    _writer(tmp_path, sessions, store).record(job_id, 1, JobState.SUCCEEDED, exit_code=0)
    with sessions() as session:
        failed = session.get(Job, job_id)
        assert failed is not None and failed.state == JobState.FAILED
        assert "huggingface/config.json" in (failed.error or "")


def test_a_fenced_out_attempt_adds_no_model(
    tmp_path: Path, sessions: sessionmaker[Session], store: LocalArtifactStore
) -> None:
    with sessions() as session:
        job_id = _job(session, store, EXPORT).id
    _writer(tmp_path, sessions, store).record(job_id, 2, JobState.SUCCEEDED, exit_code=0)
    with sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.RUNNING
        assert job.fine_tuned_model_id is None
        assert session.scalar(select(func.count()).select_from(StoredModel).where(
            StoredModel.source_job_id == job_id)) == 0  # fmt: skip


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({}, "stored no huggingface/ export"),
        ({"huggingface/config.json/x": b"{}"}, "no config.json at the top of huggingface/"),
        ({**EXPORT, "huggingface/a": b"1", "huggingface/a/b": b"2"}, "huggingface/a is both"),
        ({**EXPORT, "huggingface/../x": b"1"}, "not a plain relative path"),
    ],
)
def test_an_export_the_job_mangled_fails_the_job_naming_it_not_the_worker(
    tmp_path: Path,
    sessions: sessionmaker[Session],
    store: LocalArtifactStore,
    files: dict[str, bytes],
    reason: str,
) -> None:
    with sessions() as session:
        job_id = _job(session, store, files).id
    _writer(tmp_path, sessions, store).record(job_id, 1, JobState.SUCCEEDED, exit_code=0)
    with sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.FAILED
        assert reason in (job.error or "") and str(tmp_path) not in (job.error or "")


class FlakyStore(LocalArtifactStore):
    """A store whose reads fail ``failures`` times (a connection lost), then work."""

    failures = 1

    def fetch(self, key: str, target: Path, sha256: str | None = None) -> Path:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the store went away")
        return super().fetch(key, target, sha256)


def test_a_store_outage_is_retried_not_a_failed_job(
    tmp_path: Path, sessions: sessionmaker[Session]
) -> None:
    store = FlakyStore(tmp_path / "store")
    with sessions() as session:
        job_id = _job(session, store, EXPORT).id
    writer = _writer(tmp_path, sessions, store)
    with pytest.raises(StoreOutage, match="the store went away"):
        writer.record(job_id, 1, JobState.SUCCEEDED, exit_code=0)
    with sessions() as session:
        assert session.get(Job, job_id).state == JobState.RUNNING  # type: ignore[union-attr]
    store.failures = 2
    writer.record_surviving_outage(job_id, 1, JobState.SUCCEEDED, exit_code=0)
    with sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.SUCCEEDED
        assert job.fine_tuned_model_id is not None


def test_other_jobs_and_other_states_register_nothing(
    tmp_path: Path, sessions: sessionmaker[Session], store: LocalArtifactStore
) -> None:
    with sessions() as session:
        file_model_job = _job(session, store, EXPORT, kind="file").id
        cancelled = _job(session, store, EXPORT).id
    writer = _writer(tmp_path, sessions, store)
    writer.record(file_model_job, 1, JobState.SUCCEEDED, exit_code=0)
    writer.record(cancelled, 1, JobState.CANCELLED, exit_code=0)
    with sessions() as session:
        for job_id, state in (
            (file_model_job, JobState.SUCCEEDED),
            (cancelled, JobState.CANCELLED),
        ):
            job = session.get(Job, job_id)
            assert job is not None and job.state == state and job.fine_tuned_model_id is None
    assert store.list("models/") == []
