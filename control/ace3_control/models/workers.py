"""Live workers, and the nodes of a job (which worker runs which node rank)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from ace3_control.models.base import Base, new_id, utcnow
from ace3_control.models.states import NodeState


class Worker(Base):
    """A running worker process and what it can run; it heartbeats ``last_seen_at``.

    ``device_count`` is the most processes one job may run on it: its GPUs on a CUDA worker,
    ``ACE3_WORKER_CPU_PROCESSES`` on a CPU worker. A row not seen for the staleness window is a
    worker that is gone (see ``ace3_control.worker_registry``).
    """

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    hostname: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    device_kind: Mapped[str] = mapped_column(String(8))
    device_count: Mapped[int] = mapped_column(Integer)
    slots: Mapped[int] = mapped_column(Integer)
    queue: Mapped[str] = mapped_column(String(200))
    heartbeat_seconds: Mapped[float] = mapped_column(Float)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    # The distributions installed in the worker's Python ({canonical name: version}): what a
    # job's environment may add to but never replace (docs/environments.md). None: not sent.
    packages: Mapped[dict[str, str] | None] = mapped_column(JSON, default=None)


class JobNode(Base):
    """One node of one attempt of a multi-node job (``num_nodes > 1``): the worker that holds
    it and what that worker reports. ``node_rank`` 0 is the leader: it claimed the job, hosts
    torchrun's c10d rendezvous (``endpoint``, set once every node is claimed) and writes the
    job's state; every node heartbeats its row. A worker holds at most one node of an attempt.
    """

    __tablename__ = "job_nodes"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "worker_id", name="uq_job_nodes_job_attempt_worker"),
    )

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The worker registry id (one Celery worker, whatever its slots), and its supervisor
    # process (``host:pid``) for messages.
    worker_id: Mapped[str] = mapped_column(String(200))
    process: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16), default=NodeState.WAITING)
    endpoint: Mapped[str | None] = mapped_column(String(300), default=None)
    heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    # Why the service stopped this node's processes (cancel, a peer's failure, a lost lease);
    # None when they ended by themselves. A stopped node's exit code is not the root cause.
    stopped: Mapped[str | None] = mapped_column(Text, default=None)
    final_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
