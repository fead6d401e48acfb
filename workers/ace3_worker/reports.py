"""Turns what the ranks print and write into rows: log lines, metrics and checkpoints.

Log lines arrive on the torchrun process's stdout and stderr, prefixed ``[rank R] `` by the
runtime. Metrics and checkpoints arrive as JSON lines in ``output/events.jsonl`` (written by
rank 0). Checkpoints are verified against their sha256 before they are copied into the artifact
store and recorded; metrics and checkpoints are keyed by (job, step, name), so a resumed attempt
never duplicates a point.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, cast

from sqlalchemy import Table, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ace3.config.checkpoint_names import CHECKPOINT_NAME_RE
from ace3.config.events import (
    MAX_LINE_BYTES,
    CheckpointRecord,
    EventRecord,
    MetricsRecord,
    RefusedRecord,
    StartRecord,
    SummaryRecord,
    parse_record,
)
from ace3_control.db import insert_ignoring_duplicates, rows_changed
from ace3_control.models import (
    ACTIVE_STATES,
    Job,
    JobCheckpoint,
    JobLog,
    JobMetric,
    JobState,
    new_id,
    utcnow,
)
from ace3_control.storage import ArtifactStore
from ace3_worker.job_files import open_job_file

logger = logging.getLogger(__name__)

# What the worker reads of one attempt's events file at most (the engine writes a few hundred
# bytes a record).
MAX_EVENTS_BYTES = 256 << 20
_RANK_PREFIX = re.compile(r"^\[rank (\d{1,6})\] ?")
MAX_LINE_CHARS = 8192
MAX_LINES_PER_READ = 2000  # (parsing is the costly part: a pass of tiny lines stays short)


@dataclass
class LogLine:
    stream: str
    rank: int | None
    line: str


def storable_text(text: str) -> str:
    """``text`` as a database text column holds it: NUL bytes and lone surrogates (which a job
    can put in JSON) become U+FFFD."""
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def parse_log_line(stream: str, raw: str) -> LogLine:
    """A line as the job printed it; NUL bytes (which no database text column holds) become
    U+FFFD, and the line is cut to ``MAX_LINE_CHARS``."""
    text = raw.rstrip("\r\n").replace("\x00", "\ufffd")
    match = _RANK_PREFIX.match(text)
    if match:
        return LogLine(stream, int(match.group(1)), text[match.end() :][:MAX_LINE_CHARS])
    return LogLine(stream, None, text[:MAX_LINE_CHARS])


def store_log_lines(session: Session, job_id: str, attempt: int, lines: list[LogLine]) -> None:
    if not lines:
        return
    session.execute(
        cast(Table, JobLog.__table__).insert(),  # a Table; DeclarativeBase says FromClause
        [
            {
                "job_id": job_id,
                "attempt": attempt,
                "rank": item.rank,
                "stream": item.stream,
                "line": item.line,
                "created_at": utcnow(),
            }
            for item in lines
        ],
    )


@dataclass
class EventTail:
    """Reads complete new lines of the job's events file, remembering how far it got.

    The file is the job's: it is opened without following links (a link, FIFO or device in its
    place is refused), at most ``max_bytes_per_read`` are read per pass (the rest waits for the
    next pass) and ``max_total_bytes`` in all, and every line is validated
    (:func:`ace3.config.events.parse_record`). A line longer than the limit is refused and
    skipped up to its end. The ``start`` record is the
    attempt's plan (the smallest, if the job writes several); the last ``summary`` its outcome.
    """

    directory: Path  # the attempt's output directory (the worker's own)
    name: str = "events.jsonl"
    max_bytes_per_read: int = 1 << 20
    max_total_bytes: int = MAX_EVENTS_BYTES
    offset: int = 0
    has_more: bool = False  # the last pass stopped at max_bytes_per_read
    summary: SummaryRecord | None = None
    plan: StartRecord | None = None
    _partial: bytes = field(default=b"", repr=False)
    _skipping_long_line: bool = field(default=False, repr=False)
    _refused_file: bool = field(default=False, repr=False)
    _read_total: int = field(default=0, repr=False)

    def read_new(self) -> list[EventRecord | RefusedRecord]:
        try:
            fd = open_job_file(self.directory, self.name)
        except FileNotFoundError:
            self.has_more = False
            return []
        except OSError as exc:
            self.has_more = False
            return self._refuse_file(f"the events file cannot be read ({exc})")
        with os.fdopen(fd, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size < self.offset:  # truncated or replaced: read it again from the start
                self.offset, self._partial, self._skipping_long_line = 0, b"", False
            budget = min(self.max_bytes_per_read, self.max_total_bytes - self._read_total)
            if budget <= 0:
                self.has_more = False
                return self._refuse_file(
                    f"the events file passed {self.max_total_bytes} bytes; the rest is ignored"
                )
            handle.seek(self.offset)
            data = handle.read(budget)
        records, unread = self._records(data)
        self.offset += len(data) - unread
        self._read_total += len(data) - unread
        self.has_more = unread > 0 or len(data) == budget
        return records

    def _refuse_file(self, reason: str) -> list[EventRecord | RefusedRecord]:
        """Refuse the whole file, once."""
        if self._refused_file:
            return []
        self._refused_file = True
        return [RefusedRecord(reason=reason, excerpt="")]

    def _records(self, data: bytes) -> tuple[list[EventRecord | RefusedRecord], int]:
        """The records of the complete lines in ``data`` (after what was left of the last pass),
        at most ``MAX_LINES_PER_READ`` of them; and how many bytes of ``data`` were left unread
        (read again next pass)."""
        buffer = self._partial + data
        records: list[EventRecord | RefusedRecord] = []
        start = 0
        for _ in range(MAX_LINES_PER_READ):
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line, start = buffer[start:end], end + 1
            if self._skipping_long_line:  # the end of a line already refused
                self._skipping_long_line = False
                continue
            if line.strip():
                records.append(self._record(line))
        else:
            if buffer.find(b"\n", start) >= 0:  # more lines than a pass parses
                self._partial = b""
                return records, len(buffer) - start  # (all within data: see below)
        # (``_partial`` holds no newline, so every line found ends inside ``data``)
        self._partial = buffer[start:]
        if len(self._partial) > MAX_LINE_BYTES:
            if not self._skipping_long_line:
                records.append(
                    RefusedRecord(
                        reason=f"a line longer than {MAX_LINE_BYTES} bytes",
                        excerpt=self._partial[:200].decode("utf-8", errors="replace"),
                    )
                )
            self._partial, self._skipping_long_line = b"", True
        return records, 0

    def _record(self, line: bytes) -> EventRecord | RefusedRecord:
        record = parse_record(line)
        if isinstance(record, StartRecord) and (
            self.plan is None or record.total_steps < self.plan.total_steps
        ):
            self.plan = record  # (a second, larger plan never widens the first)
        elif isinstance(record, SummaryRecord):
            self.summary = record
        elif isinstance(record, CheckpointRecord) and self.plan is None:
            return RefusedRecord(
                reason="a checkpoint record before the run's start record",
                excerpt=line[:200].decode("utf-8", errors="replace"),
            )
        return record


def store_metrics(session: Session, job_id: str, record: MetricsRecord) -> None:
    rows = [
        {
            "job_id": job_id,
            "step": record.step,
            "epoch": record.epoch,
            "name": name,
            "value": value,
            "created_at": utcnow(),
        }
        for name, value in record.values.items()
        if value is not None
    ]
    if rows:
        session.execute(
            insert_ignoring_duplicates(session.get_bind().dialect.name, JobMetric.__table__, rows)
        )


@dataclass(frozen=True)
class StagedCheckpoint:
    """A checkpoint's verified bytes, copied into the store, waiting for its row."""

    record: CheckpointRecord
    storage_key: str
    size_bytes: int
    fresh: bool  # the copy created the key (a refused row may delete it again)


def checkpoint_problem(
    record: CheckpointRecord, visible_checkpoints_dir: PurePosixPath, plan: StartRecord | None
) -> str | None:
    """Why the worker must not act on this checkpoint record, or None.

    The file must be ``<the attempt's checkpoints directory>/<name>`` exactly (as the job sees
    it), the name the engine's ``step-<step>.pt`` / ``.dcp.tar`` for the record's step, and the
    step within the plan of the attempt's ``start`` record (which the engine writes before its
    first step, so a checkpoint record before it is refused)."""
    match = CHECKPOINT_NAME_RE.match(record.name)
    if match is None:
        return f"checkpoint name {record.name[:80]!r} is not step-<step>.pt or .dcp.tar"
    if match.group(1) != f"{record.step:08d}":
        return f"checkpoint {record.name} claims step {record.step}"
    if record.path != str(visible_checkpoints_dir / record.name):
        return (
            f"checkpoint path {record.path[:200]!r} is not {visible_checkpoints_dir}/{record.name}"
        )
    if plan is None:
        return f"checkpoint {record.name} comes before the run's start record"
    if record.step > plan.total_steps:
        return (
            f"checkpoint step {record.step} is beyond the {plan.total_steps} steps the run planned"
        )
    return None


def stage_checkpoint(
    store: ArtifactStore,
    job_id: str,
    record: CheckpointRecord,
    output_dir: Path,
    max_bytes: int,
) -> StagedCheckpoint | str:
    """Copy the checkpoint file (opened safely under ``output_dir``) into the store while
    hashing it; return the staged copy, or why it was refused. The job's file stays where it
    is: the worker deletes nothing of the job's."""
    try:
        fd = open_job_file(output_dir, f"checkpoints/{record.name}")
    except OSError as exc:
        return f"checkpoint {record.name} cannot be read ({exc.strerror or exc})"
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > max_bytes:
            return (
                f"checkpoint {record.name} ({size} bytes) is larger than "
                f"ACE3_MAX_CHECKPOINT_BYTES={max_bytes}"
            )
        if size != record.size_bytes:
            return f"checkpoint {record.name} is {size} bytes, not the {record.size_bytes} claimed"
        fresh: dict[str, bool] = {}

        def key_for(sha256: str) -> str:
            key = checkpoint_key(job_id, sha256, record.name)
            fresh[key] = not store.exists(key)
            return key

        blob = store.put_hashed(_Capped(handle, max_bytes), key_for)
    if blob.sha256 != record.sha256:
        if fresh[blob.key]:
            store.delete(blob.key)
        return f"checkpoint {record.name} failed verification (its sha256 does not match)"
    return StagedCheckpoint(record, blob.key, blob.size_bytes, fresh=fresh[blob.key])


class _Capped:
    """A reader that refuses to give more than ``limit`` bytes (the file may grow meanwhile)."""

    def __init__(self, handle: Any, limit: int) -> None:
        self.handle, self.left = handle, limit

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        chunk = self.handle.read(self.left if size < 0 else min(size, self.left))
        self.left -= len(chunk)
        return chunk


def checkpoint_key(job_id: str, sha256: str, name: str) -> str:
    """The hash in the key: a file rewritten under the same name never replaces stored bytes."""
    return f"checkpoints/{job_id}/{sha256[:16]}-{name}"


def record_checkpoint(
    session: Session,
    store: ArtifactStore,
    job_id: str,
    attempt: int,
    staged: StagedCheckpoint,
    max_checkpoints: int | None,
    best_by: tuple[str, str] | None = None,
) -> list[str]:
    """Record a staged checkpoint; return storage keys to delete once committed.

    ``best_by`` (``keep_best_checkpoint``: the job's ``checkpoint_monitor`` and
    ``checkpoint_mode``): the record's ``monitor_value`` (the job's own figure for this step)
    is compared with the job's best checkpoint here, whatever the record says; a better one
    takes the ``best`` flag. The best one is never pruned."""
    record = staged.record
    value = record.monitor_value
    if best_by is None or record.monitor != best_by[0]:
        value = None  # not asked for, or another metric than the job's monitor
    row: dict[str, Any] = {
        "id": new_id(),
        "job_id": job_id,
        "attempt": attempt,
        "step": record.step,
        "epoch": record.epoch,
        "name": record.name,
        "sha256": record.sha256,
        "size_bytes": staged.size_bytes,
        "storage_key": staged.storage_key,
        "metrics": {k: v for k, v in record.metrics.items() if v is not None},
        "created_at": utcnow(),
        "monitor_value": value,
        "best": False,
    }
    inserted = rows_changed(
        session.execute(
            insert_ignoring_duplicates(
                session.get_bind().dialect.name, JobCheckpoint.__table__, [row]
            )
        )
    )
    if not inserted:  # (job, step, name) is recorded already, with its own bytes: keep those
        recorded = session.scalar(
            select(JobCheckpoint.storage_key).where(
                JobCheckpoint.job_id == job_id,
                JobCheckpoint.step == record.step,
                JobCheckpoint.name == record.name,
            )
        )
        return [staged.storage_key] if recorded != staged.storage_key and staged.fresh else []
    if value is not None and best_by is not None:
        _take_best(session, job_id, row["id"], value, best_by[1])
    return _prune_checkpoints(session, job_id, max_checkpoints) if max_checkpoints else []


def best_by(config: dict[str, Any]) -> tuple[str, str] | None:
    """The job's (monitor, mode) when it keeps its best checkpoint (from its stored config)."""
    if not config.get("keep_best_checkpoint"):
        return None
    return str(config.get("checkpoint_monitor") or "val_loss"), str(
        config.get("checkpoint_mode") or "min"
    )


def _take_best(session: Session, job_id: str, row_id: str, value: float, mode: str) -> None:
    """Give the new checkpoint ``row_id`` the job's ``best`` flag if its value beats the best
    one's (ties keep the older)."""
    current = session.scalars(
        select(JobCheckpoint).where(JobCheckpoint.job_id == job_id, JobCheckpoint.best)
    ).first()
    if current is not None and current.monitor_value is not None:
        better = value < current.monitor_value if mode == "min" else value > current.monitor_value
        if not better:
            return
    session.execute(
        update(JobCheckpoint)
        .where(JobCheckpoint.job_id == job_id, JobCheckpoint.best)
        .values(best=False)
    )
    session.execute(update(JobCheckpoint).where(JobCheckpoint.id == row_id).values(best=True))


def _prune_checkpoints(session: Session, job_id: str, keep: int) -> list[str]:
    """Forget all but the newest ``keep`` verified checkpoints; return their storage keys.

    Never the newest one (``keep`` is at least 1), never the best one (``best``: kept beside
    the newest ``keep``), and never one that a job starts from
    (``resume_from_checkpoint``): those stay, and the foreign key refuses the delete when such a
    job was created meanwhile (then nothing is pruned this time). Nor one whose weights a job
    that has not finished starts from (``config.init_from_checkpoint_id``) or distils from
    (``config.distillation.teacher_checkpoint_id``); no foreign key there: a job created in
    between fails with the reason.
    """
    rows = session.scalars(
        select(JobCheckpoint)
        .where(JobCheckpoint.job_id == job_id)
        .order_by(JobCheckpoint.step.desc(), JobCheckpoint.created_at.desc())
    ).all()
    stale = [row for row in rows[max(keep, 1) :] if not row.best]  # the best one stays
    if not stale:
        return []
    stale_ids = [row.id for row in stale]
    pinned = set(
        session.scalars(
            select(Job.resume_from_checkpoint_id).where(
                Job.resume_from_checkpoint_id.in_(stale_ids)
            )
        )
    )
    unfinished = Job.state.in_([JobState.QUEUED, *ACTIVE_STATES])
    for weights in (
        Job.config["init_from_checkpoint_id"].as_string(),
        Job.config["distillation"]["teacher_checkpoint_id"].as_string(),
    ):
        pinned.update(session.scalars(select(weights).where(weights.in_(stale_ids), unfinished)))
    stale = [row for row in stale if row.id not in pinned]
    if not stale:
        return []
    try:
        with session.begin_nested():
            session.execute(
                delete(JobCheckpoint).where(JobCheckpoint.id.in_([row.id for row in stale]))
            )
    except IntegrityError:
        logger.info("job %s: a new job starts from an old checkpoint; pruning later", job_id)
        return []
    return [row.storage_key for row in stale]


def latest_checkpoint(session: Session, job_id: str) -> JobCheckpoint | None:
    return session.scalars(
        select(JobCheckpoint)
        .where(JobCheckpoint.job_id == job_id)
        .order_by(JobCheckpoint.step.desc())
        .limit(1)
    ).first()
