"""Jobs whose worker is known dead: re-queued by the reconciler without waiting for their lease.

A job names the worker that holds it (``jobs.worker_id``, the registry id of the ``ace3 worker``
whose slot claimed it) and, while a multi-node attempt runs, each node names its own
(``job_nodes.worker_id``). Such a worker is dead when its ``workers`` row stopped changing for
its staleness window (``worker_registry.stale_after``), or the row is gone for as long. The job's
own heartbeat does not enter the decision: a live worker whose job heartbeat is merely late keeps
the job (the lease is the backstop for that case).

The silence is measured by :class:`HeartbeatWatch` on the reconciler's own monotonic clock, as
"this ``last_seen_at`` has not changed since I first saw it", never by comparing the worker's
timestamp with the API's clock: a worker whose clock is skewed by more than the (short) window
is not declared dead for it. What the watch saw is forgotten after a failed pass or a gap between
passes longer than one reconcile interval plus one heartbeat (a database outage or stall also
stops the workers' heartbeats; they get a whole window again once the database answers).

A job claimed by a process without a registration (a supervisor run outside ``ace3 worker``, or a
worker of an earlier release, which named itself ``host:pid``) names no registry row: it is left
to its lease. If the worker was only slow, the fencing by attempt stops it: its next heartbeat
finds the job no longer its attempt's (``job_transitions.renew_lease``) and it stops its
processes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from ace3_control.settings import Settings
from ace3_control.worker_registry import STALE_HEARTBEATS

REGISTRY_ID = re.compile(r"[0-9a-f]{32}")


def is_registry_id(worker_id: str | None) -> bool:
    """Whether ``worker_id`` is a registry id (``models.new_id``), so a missing row means the
    registration is gone; anything else (``host:pid``) never had a row."""
    return worker_id is not None and REGISTRY_ID.fullmatch(worker_id) is not None


@dataclass(frozen=True)
class WorkerRow:
    """What the reconciler read of one worker: its ``last_seen_at`` and ``heartbeat_seconds``;
    None for both when the row is missing."""

    last_seen_at: datetime | None
    heartbeat_seconds: float | None = None


@dataclass
class _Sighting:
    last_seen_at: datetime | None
    since: float


class HeartbeatWatch:
    """What one reconciler saw of each worker's row across its passes, on its own monotonic
    clock (``clock``): how long a row has stayed unchanged (or missing)."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self._seen: dict[str, _Sighting] = {}
        self._last_pass: float | None = None

    @property
    def max_gap(self) -> float:
        """Passes further apart than this may have spanned a stall of the database (which held
        the heartbeats back too): start watching afresh."""
        return self.settings.reconcile_interval_seconds + self.settings.heartbeat_seconds

    def reset(self) -> None:
        """Forget everything seen (a pass failed: the database may be down for workers too)."""
        self._seen.clear()
        self._last_pass = None

    def observe(self, rows: Mapping[str, WorkerRow], now: float | None = None) -> None:
        """Record one pass's reading of the workers of interest (only those are kept)."""
        now = self.clock() if now is None else now
        if self._last_pass is not None and now - self._last_pass > self.max_gap:
            self._seen.clear()
        self._last_pass = now
        for worker_id in set(self._seen) - set(rows):
            del self._seen[worker_id]
        for worker_id, row in rows.items():
            seen = self._seen.get(worker_id)
            if seen is None or seen.last_seen_at != row.last_seen_at:
                self._seen[worker_id] = _Sighting(row.last_seen_at, now)

    def silent_for(self, worker_id: str, now: float | None = None) -> float:
        """Seconds this watch has seen the worker's row unchanged (or missing); 0 if unseen."""
        seen = self._seen.get(worker_id)
        if seen is None:
            return 0.0
        return (self.clock() if now is None else now) - seen.since


def window(row: WorkerRow, settings: Settings) -> float:
    """The staleness window of a worker: the configured one, and never less than three of the
    worker's own heartbeats (``worker_registry.stale_after``)."""
    own = STALE_HEARTBEATS * row.heartbeat_seconds if row.heartbeat_seconds else 0.0
    return max(settings.resolved_worker_stale_after_seconds, own)


@dataclass(frozen=True)
class Orphan:
    """A job to take from its worker: which worker is dead, and why it counts as dead."""

    job_id: str
    worker_id: str
    reason: str


def orphaned(
    holders: Mapping[str, Iterable[str]],
    rows: Mapping[str, WorkerRow],
    watch: HeartbeatWatch,
    now: float | None = None,
) -> list[Orphan]:
    """The jobs of ``holders`` (job id -> the ids of the workers holding its attempt: its own
    worker and, for a running multi-node attempt, each node's) one of whose workers is dead:
    its row unchanged, or missing, for its staleness window on ``watch``'s clock. ``rows`` is
    this pass's reading (a registry id without a row maps to a missing ``WorkerRow``); ids that
    are not registry ids are never judged."""
    now = watch.clock() if now is None else now
    found: list[Orphan] = []
    for job_id, worker_ids in holders.items():
        for worker_id in sorted(set(worker_ids)):
            if not is_registry_id(worker_id):
                continue
            row = rows.get(worker_id, WorkerRow(None))
            silent = watch.silent_for(worker_id, now)
            limit = window(row, watch.settings)
            if silent < limit:
                continue
            how = (
                f"its registration is gone (seen missing for {silent:.0f} s)"
                if row.last_seen_at is None
                else f"no heartbeat for {silent:.0f} s (ACE3_WORKER_STALE_AFTER_SECONDS: {limit:g} s)"
            )
            found.append(Orphan(job_id, worker_id, f"worker {worker_id} is dead: {how}"))
            break
    return found
