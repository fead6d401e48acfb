"""Turns what the ranks print and write into rows: log lines, the events file's records,
metrics.

Log lines arrive on the torchrun process's stdout and stderr, prefixed ``[rank R] `` by the
runtime. Metrics and checkpoints arrive as JSON lines in ``output/events.jsonl`` (written by
rank 0), read by :class:`EventTail`. Metrics are keyed by (job, step, name), so a resumed attempt
never duplicates a point; checkpoints are verified, copied and recorded by
:mod:`ace3_worker.checkpoints`.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from sqlalchemy import Table
from sqlalchemy.orm import Session

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
from ace3_control.db import insert_ignoring_duplicates
from ace3_control.models import (
    JobLog,
    JobMetric,
    utcnow,
)
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
