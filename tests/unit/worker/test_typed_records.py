"""The instability guard's and preemption's records through the worker's ingest (Postgres):
each validated one is kept as a typed row in job_records (bounded per attempt, the rest only
counted) and told in the job's log within a notice budget of its own, so a job on
``action="warn"`` that fires often cannot use up the refusals' notices. ``eval_samples`` records
are kept the same way, untold in the log, the newest of them up to a bound of their own (the
oldest deleted), and said once in the log when the typed records' bound leaves them no room."""

from __future__ import annotations

import json
import queue
from pathlib import Path, PurePosixPath

import pytest
from sqlalchemy import func, select

from ace3.config.events import (
    EvalSample,
    EvalSamplesRecord,
    InstabilityRecord,
    PreemptedRecord,
    parse_record,
)
from ace3_control.models import JobLog, JobRecord
from ace3_control.settings import Settings
from ace3_worker import ingest, reports
from ace3_worker.ingest import JobOutput
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


def _warn(step: int) -> str:
    return InstabilityRecord(
        step=step, action="warn", reason=f"loss spike at {step}", loss=3.5, grad_norm=None
    ).model_dump_json()


def _ingest(
    supervisor: Supervisor, directory: JobDirectory, **budgets: int
) -> tuple[str, AttemptWatch]:
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=2, state="running")
    watch = AttemptWatch(job.id, 2, output=JobOutput(**budgets))
    events = reports.EventTail(directory.output_dir)
    for _ in range(100):
        if not supervisor.ingest.store_batch(job, directory, watch, queue.Queue(), events):
            return job.id, watch
    pytest.fail("the ingest never caught up")


def test_records_are_stored_typed_with_their_notices(
    supervisor: Supervisor, directory: JobDirectory
) -> None:
    preempted = PreemptedRecord(step=7, checkpoint="step-00000007.pt").model_dump_json()
    directory.events_file.write_text(f"{_warn(3)}\n{preempted}\n")
    job_id, _ = _ingest(supervisor, directory)
    with supervisor.sessions() as session:
        rows = session.scalars(select(JobRecord).where(JobRecord.job_id == job_id)).all()
        notices = session.scalars(
            select(JobLog.line).where(JobLog.job_id == job_id, JobLog.stream == "service")
        ).all()
    assert [(row.type, row.step, row.attempt) for row in rows] == [
        ("instability", 3, 2),
        ("preempted", 7, 2),
    ]
    assert InstabilityRecord.model_validate(rows[0].payload).reason == "loss spike at 3"
    assert rows[1].payload == json.loads(preempted)
    assert sorted(notices) == [
        "ace3: the run was preempted (SIGTERM) after step 7: checkpoint step-00000007.pt",
        "ace3: training instability at step 3: loss spike at 3; step applied (warn)",
    ]


def test_a_flood_of_records_is_bounded_and_leaves_the_refusals_their_notices(
    supervisor: Supervisor, directory: JobDirectory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest, "MAX_TYPED_RECORDS_PER_ATTEMPT", 30)
    monkeypatch.setattr(ingest, "MAX_GUARD_NOTICES_PER_ATTEMPT", 10)
    lines = [_warn(step) for step in range(50)] + ["not json"]
    directory.events_file.write_text("\n".join(lines) + "\n")
    job_id, watch = _ingest(supervisor, directory, typed_records_left=30, guard_notices_left=10)
    with supervisor.sessions() as session:
        stored = session.scalar(select(func.count()).where(JobRecord.job_id == job_id))
        notices = session.scalars(
            select(JobLog.line)
            .where(JobLog.job_id == job_id, JobLog.stream == "service")
            .order_by(JobLog.id)
        ).all()
    assert stored == 30 and watch.output.typed_records_dropped == 20
    guard = [line for line in notices if "training instability" in line]
    assert len(guard) == 10
    assert guard[-1].endswith(
        "(the last of 10 instability and preemption notices logged for this attempt; later ones"
        " are not, and at most 30 records are kept)"
    )
    refusals = [line for line in notices if "refused an events record" in line]
    assert len(refusals) == 1 and "(the last of" not in refusals[0], (
        "the guard's notices did not use the refusals' budget"
    )


def _samples(step: int) -> str:
    sample = EvalSample(prompt="the quick", completion=f"<b>{step}</b>\n", completion_tokens=3)
    return EvalSamplesRecord(step=step, max_new_tokens=8, samples=[sample]).model_dump_json()


def _service_lines(supervisor: Supervisor, job_id: str) -> list[str]:
    with supervisor.sessions() as session:
        return list(
            session.scalars(
                select(JobLog.line)
                .where(JobLog.job_id == job_id, JobLog.stream == "service")
                .order_by(JobLog.id)
            ).all()
        )


def test_the_newest_eval_samples_are_kept_within_their_own_bound(
    supervisor: Supervisor, directory: JobDirectory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest, "MAX_EVAL_SAMPLE_RECORDS_PER_ATTEMPT", 3)
    monkeypatch.setattr(ingest, "RECORDS_PER_PASS", 2)  # (the oldest go over several batches)
    nul = _samples(9).replace("<b>9", "\\u0000")
    lines = [_samples(step) for step in range(7)] + [nul]
    directory.events_file.write_text("\n".join(lines) + "\n")
    job_id, watch = _ingest(supervisor, directory, eval_sample_records_left=3)
    with supervisor.sessions() as session:
        rows = session.scalars(
            select(JobRecord).where(JobRecord.job_id == job_id).order_by(JobRecord.id)
        ).all()
    assert [(row.type, row.step) for row in rows] == [("eval_samples", step) for step in (4, 5, 6)]
    assert rows[1].payload["samples"][0]["completion"] == "<b>5</b>\n"
    assert watch.output.typed_records_dropped == 0
    assert watch.output.typed_records_left == ingest.MAX_TYPED_RECORDS_PER_ATTEMPT - 3
    notices = _service_lines(supervisor, job_id)
    assert len(notices) == 1, notices
    assert "refused an events record (eval_samples.samples.0.completion" in notices[0]


def test_eval_samples_past_the_typed_records_bound_are_dropped_with_one_notice(
    supervisor: Supervisor, directory: JobDirectory
) -> None:
    lines = [_warn(0)] + [_samples(step) for step in range(1, 5)]
    directory.events_file.write_text("\n".join(lines) + "\n")
    job_id, watch = _ingest(supervisor, directory, typed_records_left=3, guard_notices_left=0)
    with supervisor.sessions() as session:
        rows = session.scalars(
            select(JobRecord).where(JobRecord.job_id == job_id).order_by(JobRecord.id)
        ).all()
    assert [(row.type, row.step) for row in rows] == [
        ("instability", 0), ("eval_samples", 1), ("eval_samples", 2)
    ]  # fmt: skip
    assert watch.output.typed_records_dropped == 2
    notices = _service_lines(supervisor, job_id)
    assert notices == [
        "ace3: the eval_samples record of step 3 is not kept, nor later ones: this attempt's "
        f"typed records reached their bound of {ingest.MAX_TYPED_RECORDS_PER_ATTEMPT}"
    ]


@pytest.mark.parametrize(
    "reason", ["a\x85b", "line\u2028break", "para\u2029graph", "esc\x1b[2J", "del\x7f", "\x9b31m"]
)
def test_control_characters_in_a_record_s_text_are_refused(reason: str) -> None:
    line = json.dumps({"type": "instability", "step": 1, "action": "warn", "reason": reason})
    assert type(parse_record(line.encode())).__name__ == "RefusedRecord"
    preempted = json.dumps({"type": "preempted", "step": 1, "checkpoint": f"x{reason}.pt"})
    assert type(parse_record(preempted.encode())).__name__ == "RefusedRecord"
