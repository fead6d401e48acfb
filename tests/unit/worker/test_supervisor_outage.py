"""A database outage while a job trains loses nothing: drained log lines and events wait for the
next pass, and the attempt stops only once its lease can no longer have been renewed."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from ace3_server.migrations_check import upgrade
from ace3_server.models import Job, JobLog, JobMetric
from ace3_server.settings import Settings
from ace3_worker import reports
from ace3_worker.supervisor import AttemptWatch, Supervisor
from tests.conftest import insert_job


@pytest.fixture()
def supervisor(tmp_path: Path) -> Supervisor:
    settings = Settings(data_dir=tmp_path, lease_seconds=30)
    upgrade(settings.resolved_database_url)
    return Supervisor(settings)


def _job(supervisor: Supervisor) -> Job:
    with supervisor.sessions() as session:
        return insert_job(session, attempt=1, state="running")


def _unreachable() -> None:
    raise OperationalError("SELECT 1", {}, Exception("connection refused"))


def test_lines_and_metrics_drained_during_an_outage_are_stored_afterwards(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    job = _job(supervisor)
    watch = AttemptWatch(job.id, 1)
    lines: queue.Queue[reports.LogLine] = queue.Queue()
    lines.put(reports.parse_log_line("stdout", "[rank 0] step 1\n"))
    events_file = tmp_path / "events.jsonl"
    events_file.write_text(
        '{"type": "metrics", "step": 1, "epoch": 1, "values": {"train_loss": 0.5}}\n'
    )
    events = reports.EventTail(events_file)
    working = supervisor.sessions
    supervisor.sessions = _unreachable  # type: ignore[assignment]
    process = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        supervisor._tolerating_database_errors(
            watch, process, lambda: supervisor._ingest(job, watch, lines, events)
        )
        assert len(watch.pending_lines) == 1 and len(watch.pending_events) == 1
        assert process.poll() is None, "a short outage does not stop training"
        supervisor.sessions = working
        supervisor._ingest(job, watch, lines, events)
    finally:
        process.kill()
        process.wait()
    assert watch.pending_lines == [] and watch.pending_events == []
    with working() as session:
        assert [log.line for log in session.scalars(select(JobLog))] == ["step 1"]
        assert [(m.name, m.value) for m in session.scalars(select(JobMetric))] == [
            ("train_loss", 0.5)
        ]


def test_an_outage_longer_than_the_lease_stops_the_attempt(supervisor: Supervisor) -> None:
    watch = AttemptWatch("job", 1)
    process = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        supervisor._tolerating_database_errors(watch, process, _unreachable)
        assert not watch.lease_lost and process.poll() is None
        watch.lease_renewed_at = time.monotonic() - supervisor.settings.lease_seconds - 1
        supervisor._tolerating_database_errors(watch, process, _unreachable)
        assert watch.lease_lost and watch.terminate_sent_at is not None
        assert process.wait(timeout=5) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
