"""A database outage while a job trains loses nothing: drained log lines and events wait for the
next pass, and the attempt stops only once its lease can no longer have been renewed."""

from __future__ import annotations

import queue
import signal
import subprocess
import time
from pathlib import Path, PurePosixPath

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from ace3_control.models import Job, JobLog, JobMetric
from ace3_control.settings import Settings
from ace3_server.migrations_check import upgrade
from ace3_worker import reports
from ace3_worker.job_dir import JobDirectory
from ace3_worker.sandbox.launch import SandboxedProcess
from ace3_worker.sandbox.plan import SandboxPlan
from ace3_worker.supervisor import Supervisor
from ace3_worker.watch import AttemptWatch
from tests.conftest import insert_job


@pytest.fixture()
def supervisor(tmp_path: Path) -> Supervisor:
    settings = Settings(data_dir=tmp_path, lease_seconds=30)
    upgrade(settings.resolved_database_url)
    return Supervisor(settings)


def _job(supervisor: Supervisor) -> Job:
    with supervisor.sessions() as session:
        return insert_job(session, attempt=1, state="running")


def _sleeping() -> SandboxedProcess:
    """A stand-in for torchrun, run without a sandbox."""
    plan = SandboxPlan(mode="none", dedicated_uids=False, runtime_paths=(), hidden=())
    return SandboxedProcess(subprocess.Popen(["sleep", "30"], start_new_session=True), plan, None)


def _unreachable() -> None:
    raise OperationalError("SELECT 1", {}, Exception("connection refused"))


def test_lines_and_metrics_drained_during_an_outage_are_stored_afterwards(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    job = _job(supervisor)
    watch = AttemptWatch(job.id, 1)
    lines: queue.Queue[reports.LogLine] = queue.Queue()
    lines.put(reports.parse_log_line("stdout", "[rank 0] step 1\n"))
    directory = JobDirectory(tmp_path, PurePosixPath("/job"))
    directory.output_dir.mkdir()
    directory.events_file.write_text(
        '{"type": "metrics", "step": 1, "epoch": 1, "values": {"train_loss": 0.5}}\n'
    )
    events = reports.EventTail(directory.output_dir)
    working = supervisor.ingest.sessions
    supervisor.ingest.sessions = _unreachable  # type: ignore[assignment]
    process = _sleeping()
    try:
        supervisor.watcher.tolerating_database_errors(
            watch,
            process,
            lambda: supervisor.ingest.store_batch(job, directory, watch, lines, events),
        )
        assert len(watch.output.pending_lines) == 1 and len(watch.output.pending_records) == 1
        assert process.poll() is None, "a short outage does not stop training"
        supervisor.ingest.sessions = working
        supervisor.ingest.store_batch(job, directory, watch, lines, events)
    finally:
        process.kill()
        process.wait()
    assert watch.output.pending_lines == [] and watch.output.pending_records == []
    with working() as session:
        assert [log.line for log in session.scalars(select(JobLog))] == ["step 1"]
        assert [(m.name, m.value) for m in session.scalars(select(JobMetric))] == [
            ("train_loss", 0.5)
        ]


def test_an_outage_longer_than_the_lease_stops_the_attempt(supervisor: Supervisor) -> None:
    watch = AttemptWatch("job", 1)
    process = _sleeping()
    try:
        supervisor.watcher.tolerating_database_errors(watch, process, _unreachable)
        assert not watch.run.lease_lost and process.poll() is None
        watch.run.lease_renewed_at = time.monotonic() - supervisor.settings.lease_seconds - 1
        supervisor.watcher.tolerating_database_errors(watch, process, _unreachable)
        assert watch.run.lease_lost and watch.run.terminate_sent_at is not None
        assert process.wait(timeout=5) == -signal.SIGTERM
    finally:
        process.kill()


def test_the_last_records_and_the_outcome_are_stored_through_an_outage(
    supervisor: Supervisor,
) -> None:
    watch = AttemptWatch("job", 1)
    calls: list[str] = []

    def beat() -> None:
        calls.append("beat")
        watch.run.lease_renewed_at = time.monotonic()

    def flaky() -> None:
        calls.append("store")
        if calls.count("store") < 3:
            _unreachable()

    watch.run.lease_renewed_at = time.monotonic() - 10  # the heartbeat is due
    supervisor.watcher.through_outage(watch, beat, flaky)
    assert calls.count("store") == 3 and not watch.run.lease_lost
    assert calls[0] == "beat", "the lease is renewed before the final pass"


def test_a_final_pass_gives_up_once_the_lease_cannot_be_ours(supervisor: Supervisor) -> None:
    watch = AttemptWatch("job", 1)
    watch.run.lease_renewed_at = time.monotonic() - supervisor.settings.lease_seconds - 1
    supervisor.watcher.through_outage(watch, _unreachable, _unreachable)
    assert watch.run.lease_lost, "the reconciler re-queues the job; this attempt records nothing"


def test_each_pass_stores_a_bounded_batch(supervisor: Supervisor, tmp_path: Path) -> None:
    from ace3_worker.ingest import LINES_PER_PASS

    job = _job(supervisor)
    watch = AttemptWatch(job.id, 1)
    lines: queue.Queue[reports.LogLine] = queue.Queue()
    for index in range(LINES_PER_PASS + 10):
        lines.put(reports.parse_log_line("stdout", f"[rank 0] line {index}\n"))
    directory = JobDirectory(tmp_path, PurePosixPath("/job"))
    directory.output_dir.mkdir()
    events = reports.EventTail(directory.output_dir)
    assert supervisor.ingest.store_batch(job, directory, watch, lines, events) is True, (
        "more is waiting"
    )
    with supervisor.sessions() as session:
        assert len(session.scalars(select(JobLog)).all()) == LINES_PER_PASS
    assert supervisor.ingest.store_batch(job, directory, watch, lines, events) is False
    with supervisor.sessions() as session:
        assert len(session.scalars(select(JobLog)).all()) == LINES_PER_PASS + 10
