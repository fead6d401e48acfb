"""Keep-last-N never deletes the only (or newest) verified checkpoint, nor one a job (or an
unfinished search's base config) starts from; and an attempt resumes from the job's own newest
checkpoint, else from the one it was created from."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from ace3.config.events import CheckpointRecord
from ace3_control.models import Job, JobCheckpoint, Search
from ace3_control.settings import Settings
from ace3_control.storage import LocalArtifactStore
from ace3_server.migrations_check import upgrade
from ace3_worker import checkpoints
from ace3_worker.supervisor import Supervisor
from ace3_worker.workspace import resume_checkpoint
from tests.conftest import insert_job


@pytest.fixture()
def supervisor(tmp_path: Path) -> Supervisor:
    (tmp_path / "data").mkdir()
    settings = Settings(data_dir=tmp_path / "data")
    upgrade(settings.resolved_database_url)
    return Supervisor(settings)


def _checkpoint_event(directory: Path, step: int, payload: bytes | None = None) -> dict:
    """A checkpoint file in ``directory/checkpoints`` (an attempt's output directory) and the
    record that announces it."""
    data = payload if payload is not None else f"weights at {step}".encode()
    path = directory / "checkpoints" / f"step-{step:08d}.pt"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return {
        "type": "checkpoint",
        "step": step,
        "epoch": 1,
        "name": path.name,
        "path": f"/job/output/checkpoints/{path.name}",
        "sha256": hashlib.sha256(data).hexdigest(),
        "size_bytes": len(data),
        "metrics": {},
    }


def _store(
    session: Session,
    store: LocalArtifactStore,
    job: Job,
    event: dict,
    keep: int | None,
    output_dir: Path,
) -> None:
    record = CheckpointRecord.model_validate(event)
    staged = checkpoints.stage_checkpoint(store, job.id, record, output_dir, 1 << 30)
    if isinstance(staged, str):  # refused: nothing recorded
        return
    stale = checkpoints.record_checkpoint(session, store, job.id, 1, staged, keep)
    session.commit()
    for key in stale:
        store.delete(key)


def _steps(session: Session, job_id: str) -> list[int]:
    return list(
        session.scalars(
            select(JobCheckpoint.step)
            .where(JobCheckpoint.job_id == job_id)
            .order_by(JobCheckpoint.step)
        )
    )


def test_keep_one_keeps_the_only_checkpoint(supervisor: Supervisor, tmp_path: Path) -> None:
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=1, state="running")
        _store(
            session,
            supervisor.store,
            job,
            _checkpoint_event(tmp_path, 10),
            keep=1,
            output_dir=tmp_path,
        )
        (row,) = session.scalars(select(JobCheckpoint).where(JobCheckpoint.job_id == job.id))
        assert row.step == 10 and supervisor.store.exists(row.storage_key)


def test_keep_last_n_deletes_older_rows_and_their_bytes(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=1, state="running")
        _store(
            session,
            supervisor.store,
            job,
            _checkpoint_event(tmp_path, 10),
            keep=2,
            output_dir=tmp_path,
        )
        oldest_key = session.scalar(select(JobCheckpoint.storage_key))
        for step in (20, 30):
            _store(
                session,
                supervisor.store,
                job,
                _checkpoint_event(tmp_path, step),
                keep=2,
                output_dir=tmp_path,
            )
        assert _steps(session, job.id) == [20, 30]
        assert not supervisor.store.exists(oldest_key)


def test_a_failed_verification_never_costs_the_last_good_checkpoint(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=1, state="running")
        _store(
            session,
            supervisor.store,
            job,
            _checkpoint_event(tmp_path, 10),
            keep=1,
            output_dir=tmp_path,
        )
        corrupt = _checkpoint_event(tmp_path, 20)
        corrupt["sha256"] = "0" * 64  # the bytes on disk are not the announced ones
        _store(session, supervisor.store, job, corrupt, keep=1, output_dir=tmp_path)
        assert _steps(session, job.id) == [10], "the only verified checkpoint stays"


def test_a_checkpoint_another_job_starts_from_is_never_pruned(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=1, state="running")
        _store(
            session,
            supervisor.store,
            job,
            _checkpoint_event(tmp_path, 10),
            keep=1,
            output_dir=tmp_path,
        )
        origin = session.scalars(select(JobCheckpoint)).one()
        follower = Job(
            owner_id=job.owner_id,
            model_id=job.model_id,
            dataset_id=job.dataset_id,
            config={},
            model_kwargs={},
            num_processes=1,
            request_hash="h2",
            resume_from_checkpoint_id=origin.id,
        )
        session.add(follower)
        session.commit()
        for step in (20, 30):
            _store(
                session,
                supervisor.store,
                job,
                _checkpoint_event(tmp_path, step),
                keep=1,
                output_dir=tmp_path,
            )
        assert _steps(session, job.id) == [10, 30], "the newest, and the one a job starts from"
        assert supervisor.store.exists(origin.storage_key)


def test_a_checkpoint_an_unfinished_job_takes_weights_from_is_kept_until_it_finishes(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=1, state="running")
        _store(session, supervisor.store, job, _checkpoint_event(tmp_path, 10), keep=1,
               output_dir=tmp_path)  # fmt: skip
        origin = session.scalars(select(JobCheckpoint)).one()
        fine_tuning = Job(
            owner_id=job.owner_id, model_id=job.model_id, dataset_id=job.dataset_id,
            config={"init_from_checkpoint_id": origin.id}, model_kwargs={}, num_processes=1,
            request_hash="h3", state="queued",
        )  # fmt: skip
        session.add(fine_tuning)
        session.commit()
        _store(session, supervisor.store, job, _checkpoint_event(tmp_path, 20), keep=1,
               output_dir=tmp_path)  # fmt: skip
        assert _steps(session, job.id) == [10, 20], "kept while the fine-tuning job waits"
        fine_tuning.state = "succeeded"
        student = Job(
            owner_id=job.owner_id, model_id=job.model_id, dataset_id=job.dataset_id,
            config={"distillation": {"teacher_checkpoint_id": origin.id}}, model_kwargs={},
            num_processes=1, request_hash="h4", state="running",
        )  # fmt: skip
        session.add(student)
        session.commit()
        _store(session, supervisor.store, job, _checkpoint_event(tmp_path, 30), keep=1,
               output_dir=tmp_path)  # fmt: skip
        assert _steps(session, job.id) == [10, 30], "kept while a student distils from it"
        student.state = "failed"
        session.commit()
        _store(session, supervisor.store, job, _checkpoint_event(tmp_path, 40), keep=1,
               output_dir=tmp_path)  # fmt: skip
        assert _steps(session, job.id) == [40]
        assert not supervisor.store.exists(origin.storage_key)


def _search(job: Job, state: str, base_config: dict) -> Search:
    return Search(
        owner_id=job.owner_id, model_id=job.model_id, dataset_id=job.dataset_id,
        config={"search_space": {}, "base_config": base_config}, model_kwargs={},
        request_hash=f"search-{state}", state=state,
    )  # fmt: skip


def test_a_checkpoint_an_unfinished_search_starts_its_trials_from_is_kept_until_it_finishes(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    """A search's trials' jobs are made later, from its base_config: while the search has not
    finished, the weights it names there are kept as if a job named them."""
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=1, state="running")
        _store(session, supervisor.store, job, _checkpoint_event(tmp_path, 10), keep=1,
               output_dir=tmp_path)  # fmt: skip
        origin = session.scalars(select(JobCheckpoint)).one()
        queued = _search(job, "queued", {"init_from_checkpoint_id": origin.id})
        session.add(queued)
        session.commit()
        _store(session, supervisor.store, job, _checkpoint_event(tmp_path, 20), keep=1,
               output_dir=tmp_path)  # fmt: skip
        assert _steps(session, job.id) == [10, 20], "kept while the search is queued"
        queued.state = "succeeded"
        distilling = _search(job, "running", {"distillation": {"teacher_checkpoint_id": origin.id}})
        session.add(distilling)
        session.commit()
        _store(session, supervisor.store, job, _checkpoint_event(tmp_path, 30), keep=1,
               output_dir=tmp_path)  # fmt: skip
        assert _steps(session, job.id) == [10, 30], "kept while its trials distil from it"
        distilling.state = "cancelled"
        session.commit()
        _store(session, supervisor.store, job, _checkpoint_event(tmp_path, 40), keep=1,
               output_dir=tmp_path)  # fmt: skip
        assert _steps(session, job.id) == [40], "prunable once the searches finished"
        assert not supervisor.store.exists(origin.storage_key)


def test_an_attempt_resumes_from_its_own_newest_checkpoint_else_from_its_origin(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    with supervisor.sessions() as session:
        source = insert_job(session, attempt=1, state="succeeded")
        _store(
            session,
            supervisor.store,
            source,
            _checkpoint_event(tmp_path, 46),
            keep=None,
            output_dir=tmp_path,
        )
        origin = session.scalars(select(JobCheckpoint)).one()
        job = Job(
            owner_id=source.owner_id,
            model_id=source.model_id,
            dataset_id=source.dataset_id,
            config={},
            model_kwargs={},
            num_processes=1,
            request_hash="h2",
            resume_from_checkpoint_id=origin.id,
        )
        session.add(job)
        session.commit()

        assert resume_checkpoint(session, job, 1) == origin
        assert resume_checkpoint(session, job, 2) == origin, "no checkpoint of its own yet"
        _store(
            session,
            supervisor.store,
            job,
            _checkpoint_event(tmp_path, 60),
            keep=None,
            output_dir=tmp_path,
        )
        own = resume_checkpoint(session, job, 2)
        assert own is not None and own.job_id == job.id and own.step == 60
        assert resume_checkpoint(session, source, 1) is None


def test_the_best_checkpoint_is_kept_beside_the_newest_and_moves_when_beaten(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    """keep_best_checkpoint: the worker judges each record's monitored value itself; the best
    one is never pruned, and loses its flag (then goes like any other) once beaten."""
    values = {10: 3.0, 20: 1.0, 30: 2.0, 40: 4.0, 50: 5.0, 60: 0.5, 70: 9.0}
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=1, state="running")
        for step, value in values.items():
            event = _checkpoint_event(tmp_path, step)
            # the job claims "best" for every one: the worker decides from the values
            event.update(monitor="val_loss", monitor_value=value, best=True)
            staged = checkpoints.stage_checkpoint(
                supervisor.store, job.id, CheckpointRecord.model_validate(event), tmp_path, 1 << 30
            )
            assert not isinstance(staged, str)
            stale = checkpoints.record_checkpoint(
                session, supervisor.store, job.id, 1, staged, 2, ("val_loss", "min")
            )
            session.commit()
            for key in stale:
                supervisor.store.delete(key)
            if step == 50:
                assert _steps(session, job.id) == [20, 40, 50]  # best (1.0) + newest 2
        assert _steps(session, job.id) == [60, 70]  # 60 (0.5) beat 20, which went
        rows = session.scalars(select(JobCheckpoint).where(JobCheckpoint.job_id == job.id)).all()
        assert [(row.step, row.best, row.monitor_value) for row in rows] == [
            (60, True, 0.5),
            (70, False, 9.0),
        ]
        assert all(supervisor.store.exists(row.storage_key) for row in rows)
        # another metric than the job's monitor is not judged
        event = _checkpoint_event(tmp_path, 80)
        event.update(monitor="train_loss", monitor_value=0.0)
        staged = checkpoints.stage_checkpoint(
            supervisor.store, job.id, CheckpointRecord.model_validate(event), tmp_path, 1 << 30
        )
        assert not isinstance(staged, str)
        checkpoints.record_checkpoint(
            session, supervisor.store, job.id, 1, staged, 2, ("val_loss", "min")
        )
        session.commit()
        best = session.scalars(
            select(JobCheckpoint.step).where(JobCheckpoint.job_id == job.id, JobCheckpoint.best)
        ).all()
        assert best == [60]
