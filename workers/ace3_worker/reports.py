"""Turns what the ranks print and write into rows: log lines, metrics and checkpoints.

Log lines arrive on the torchrun process's stdout and stderr, prefixed ``[rank R] `` by the
runtime. Metrics and checkpoints arrive as JSON lines in ``output/events.jsonl`` (written by
rank 0). Checkpoints are verified against their sha256 before they are copied into the artifact
store and recorded; metrics and checkpoints are keyed by (job, step, name), so a resumed attempt
never duplicates a point.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ace3_server.db import insert_ignoring_duplicates
from ace3_server.models import Job, JobCheckpoint, JobLog, JobMetric, new_id, utcnow
from ace3_server.storage import LocalArtifactStore, sha256_file

logger = logging.getLogger(__name__)

_RANK_PREFIX = re.compile(r"^\[rank (\d+)\] ?")
MAX_LINE_CHARS = 8192


@dataclass
class LogLine:
    stream: str
    rank: int | None
    line: str


def parse_log_line(stream: str, raw: str) -> LogLine:
    text = raw.rstrip("\r\n")
    match = _RANK_PREFIX.match(text)
    if match:
        return LogLine(stream, int(match.group(1)), text[match.end() :][:MAX_LINE_CHARS])
    return LogLine(stream, None, text[:MAX_LINE_CHARS])


def store_log_lines(session: Session, job_id: str, attempt: int, lines: list[LogLine]) -> None:
    if not lines:
        return
    session.execute(
        JobLog.__table__.insert(),
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
    """Reads complete new lines of the events file, remembering how far it got."""

    path: Path
    offset: int = 0
    summary: dict[str, Any] | None = None
    _partial: bytes = field(default=b"", repr=False)

    def read_new(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        self.offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        events = []
        for line in lines:
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("skipping a malformed events line: %r", line[:200])
        return events


def _finite(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and value == value
        and value not in (float("inf"), float("-inf"))
    )


def store_metrics(session: Session, job_id: str, event: dict[str, Any]) -> None:
    step = int(event["step"])
    epoch = event.get("epoch")
    rows = [
        {
            "job_id": job_id,
            "step": step,
            "epoch": float(epoch) if epoch is not None else None,
            "name": str(name)[:200],
            "value": float(value),
            "created_at": utcnow(),
        }
        for name, value in (event.get("values") or {}).items()
        if _finite(value)
    ]
    if rows:
        session.execute(
            insert_ignoring_duplicates(session.get_bind().dialect.name, JobMetric.__table__, rows)
        )


def store_checkpoint(
    session: Session,
    store: LocalArtifactStore,
    job_id: str,
    attempt: int,
    event: dict[str, Any],
    max_checkpoints: int | None,
) -> list[str]:
    """Verify, store and record a checkpoint; return storage keys to delete once committed."""
    source = Path(event["path"])
    name = Path(str(event["name"])).name
    expected = str(event["sha256"])
    # The hash in the key: a file rewritten under the same name can never replace stored bytes.
    key = f"checkpoints/{job_id}/{expected[:16]}-{name}"
    if source.is_file() and sha256_file(source) == expected:
        store.put_file(key, source)
        source.unlink()  # the store has it now: the job directory stays small
    elif not (store.exists(key) and sha256_file(store.path_for(key)) == expected):
        # (An event retried after a database error finds the file already moved to the store.)
        logger.error("job %s: checkpoint %s failed verification; not recorded", job_id, name)
        return []
    row = {
        "id": new_id(),
        "job_id": job_id,
        "attempt": attempt,
        "step": int(event["step"]),
        "epoch": event.get("epoch"),
        "name": name,
        "sha256": expected,
        "size_bytes": int(event.get("size_bytes") or source.stat().st_size),
        "storage_key": key,
        "metrics": {k: v for k, v in (event.get("metrics") or {}).items() if _finite(v)},
        "created_at": utcnow(),
    }
    inserted = session.execute(
        insert_ignoring_duplicates(session.get_bind().dialect.name, JobCheckpoint.__table__, [row])
    ).rowcount
    if not inserted:  # (job, step, name) is recorded already, with its own bytes: keep those
        recorded = session.scalar(
            select(JobCheckpoint.storage_key).where(
                JobCheckpoint.job_id == job_id,
                JobCheckpoint.step == row["step"],
                JobCheckpoint.name == name,
            )
        )
        if recorded != key:
            store.delete(key)
        return []
    return _prune_checkpoints(session, job_id, max_checkpoints) if max_checkpoints else []


def _prune_checkpoints(session: Session, job_id: str, keep: int) -> list[str]:
    """Forget all but the newest ``keep`` verified checkpoints; return their storage keys.

    Never the newest one (``keep`` is at least 1), and never one that a job starts from
    (``resume_from_checkpoint``): those stay, and the foreign key refuses the delete when such a
    job was created meanwhile (then nothing is pruned this time).
    """
    rows = session.scalars(
        select(JobCheckpoint)
        .where(JobCheckpoint.job_id == job_id)
        .order_by(JobCheckpoint.step.desc(), JobCheckpoint.created_at.desc())
    ).all()
    stale = rows[max(keep, 1) :]
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
