"""An events file written to hurt the worker: NUL bytes in what a refusal quotes, floods of
refused lines, repeated and non-canonical checkpoint records. Stored in Postgres (whose text
columns refuse NUL, unlike SQLite's) through the supervisor's own ingest pass."""

from __future__ import annotations

import hashlib
import json
import queue
from pathlib import Path, PurePosixPath

import pytest
from sqlalchemy import func, select

from ace3_control.models import Job, JobCheckpoint, JobLog
from ace3_control.settings import Settings
from ace3_worker import checkpoints, reports
from ace3_worker.attempt import MAX_NOTICES_PER_ATTEMPT
from ace3_worker.job_dir import JobDirectory
from ace3_worker.supervisor import Supervisor
from ace3_worker.watch import AttemptWatch
from tests.conftest import insert_job


@pytest.fixture()
def supervisor(tmp_path: Path, database_url: str) -> Supervisor:
    return Supervisor(Settings(data_dir=tmp_path, database_url=database_url, lease_seconds=30))


@pytest.fixture()
def directory(tmp_path: Path) -> JobDirectory:
    directory = JobDirectory(tmp_path / "attempt", PurePosixPath("/job"))
    directory.checkpoints_dir.mkdir(parents=True)
    return directory


def _ingest_everything(
    supervisor: Supervisor, directory: JobDirectory
) -> tuple[str, AttemptWatch, reports.EventTail]:
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=1, state="running")
    watch = AttemptWatch(job.id, 1)
    events = reports.EventTail(directory.output_dir)
    lines: queue.Queue[reports.LogLine] = queue.Queue()
    for _ in range(100):
        if not supervisor.ingest.store_batch(job, directory, watch, lines, events):
            break
    else:
        pytest.fail("the ingest never caught up")
    return job.id, watch, events


def _service_lines(supervisor: Supervisor, job_id: str) -> list[str]:
    with supervisor.sessions() as session:
        return list(
            session.scalars(
                select(JobLog.line)
                .where(JobLog.job_id == job_id, JobLog.stream == "service")
                .order_by(JobLog.id)
            )
        )


def test_nul_bytes_quoted_by_a_refusal_are_stored_without_them(
    supervisor: Supervisor, directory: JobDirectory
) -> None:
    directory.events_file.write_bytes(
        b'\x00\n{"type": "\\u0000"}\n{"type": "metrics", "step": 1, "values": {}, "\\u0000": 1}\n'
        b'{"type": "\\ud800"}\n'
    )
    job_id, watch, _ = _ingest_everything(supervisor, directory)
    stored = _service_lines(supervisor, job_id)
    assert len(stored) == 4 and watch.output.pending_records == []
    assert not any("\x00" in line for line in stored)


def test_a_flood_of_refused_lines_is_parsed_in_bounded_passes_and_logged_a_bounded_number_of_times(
    supervisor: Supervisor, directory: JobDirectory
) -> None:
    directory.events_file.write_bytes(b"x\n" * 5000)
    events = reports.EventTail(directory.output_dir)
    assert len(events.read_new()) == reports.MAX_LINES_PER_READ and events.has_more
    job_id, _, events = _ingest_everything(supervisor, directory)
    assert events.offset == 2 * 5000, "every line was read once"
    stored = _service_lines(supervisor, job_id)
    assert len(stored) == MAX_NOTICES_PER_ATTEMPT
    assert "later ones are not" in stored[-1]


def _checkpoint_record(directory: JobDirectory, name: str, step: int, data: bytes) -> str:
    return json.dumps(
        {
            "type": "checkpoint",
            "step": step,
            "name": name,
            "path": f"/job/output/checkpoints/{name}",
            "sha256": hashlib.sha256(data).hexdigest(),
            "size_bytes": len(data),
        }
    )


def test_a_repeated_checkpoint_record_is_copied_once_and_odd_names_are_refused(
    supervisor: Supervisor, directory: JobDirectory
) -> None:
    data = b"weights" * 1000
    names = [
        "step-00000001.pt",
        "step-000000001.pt",
        "step-\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668.pt",
    ]
    for name in names:
        (directory.checkpoints_dir / name).write_bytes(data)
    checkpoint = _checkpoint_record(directory, names[0], 1, data)
    directory.events_file.write_text(
        "\n".join(
            [
                checkpoint,  # before the plan: refused, even though the plan follows in this read
                json.dumps({"type": "start", "total_steps": 10}),
                *[checkpoint] * 50,
                _checkpoint_record(directory, names[1], 1, data),
                _checkpoint_record(directory, names[2], 12345678, data),
                json.dumps({**json.loads(checkpoint), "name": names[0] + "\n"}),
            ]
        )
        + "\n"
    )
    staged: list[str] = []
    original = checkpoints.stage_checkpoint

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        staged.append(args[2].name)
        return original(*args, **kwargs)

    reports_stage = pytest.MonkeyPatch()
    reports_stage.setattr(checkpoints, "stage_checkpoint", counting)
    try:
        job_id, _, _ = _ingest_everything(supervisor, directory)
    finally:
        reports_stage.undo()
    assert staged == [names[0]], "one copy, however often the record repeats"
    with supervisor.sessions() as session:
        rows = session.scalar(
            select(func.count()).select_from(JobCheckpoint).where(JobCheckpoint.job_id == job_id)
        )
    assert rows == 1
    stored = "\n".join(_service_lines(supervisor, job_id))
    assert "before the run's start record" in stored
    assert stored.count("was already taken") == 49
    assert "claims step 1" in stored and "is not step-<step>.pt" in stored


def test_the_start_record_s_plan_is_kept_on_the_job_and_a_larger_one_never_widens_it(
    supervisor: Supervisor, directory: JobDirectory
) -> None:
    plan = {"total_steps": 40, "steps_per_epoch": 10, "epochs": 4, "world_size": 2,
            "resumed_from_step": 0}  # fmt: skip
    directory.events_file.write_text(
        "\n".join(
            [
                json.dumps({"type": "start", **plan}),
                json.dumps({"type": "start", **plan, "total_steps": 10**6}),  # not taken
                json.dumps({"type": "start", **plan, "bogus": 1}),  # refused
            ]
        )
        + "\n"
    )
    job_id, _, _ = _ingest_everything(supervisor, directory)
    with supervisor.sessions() as session:
        assert session.get(Job, job_id).plan == plan  # type: ignore[union-attr]
    assert any("bogus" in line for line in _service_lines(supervisor, job_id))


def test_a_plan_read_after_the_attempt_lost_the_job_is_not_stored(
    supervisor: Supervisor, directory: JobDirectory
) -> None:
    directory.events_file.write_text(json.dumps({"type": "start", "total_steps": 5}) + "\n")
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=2, state="running")  # a newer attempt owns it
    watch = AttemptWatch(job.id, 1)
    events = reports.EventTail(directory.output_dir)
    while supervisor.ingest.store_batch(job, directory, watch, queue.Queue(), events):
        pass
    with supervisor.sessions() as session:
        assert session.get(Job, job.id).plan is None  # type: ignore[union-attr]
