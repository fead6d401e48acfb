"""A job's checkpoints as the worker stores them: an events record's checkpoint is checked
(:func:`checkpoint_problem`: its name and step, its path inside the attempt's checkpoint
directory, the run's plan), its bytes copied into the artifact store against their sha256
(:func:`stage_checkpoint`), then recorded keyed by (job, step, name), the best one marked and
the oldest pruned past ``max_checkpoints`` (:func:`record_checkpoint`); :func:`latest_checkpoint`
is what a next attempt resumes from. What the ranks print and the other records are
:mod:`ace3_worker.reports`'.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ace3.config.checkpoint_names import CHECKPOINT_NAME_RE
from ace3.config.events import CheckpointRecord, StartRecord
from ace3_control.db import insert_ignoring_duplicates, rows_changed
from ace3_control.models import Job, JobCheckpoint, new_id, utcnow
from ace3_control.storage import ArtifactStore
from ace3_control.weights_users import weights_users
from ace3_worker.job_files import open_job_file

logger = logging.getLogger(__name__)


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
    (``config.distillation.teacher_checkpoint_id``), or that a search that has not finished
    names so in its ``base_config`` (its trials' jobs are made later):
    :func:`ace3_control.weights_users.weights_users`. No foreign key there: a job or search
    created in between fails with the reason.
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
    pinned.update(session.scalars(weights_users(stale_ids)))
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
