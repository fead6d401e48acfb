"""What jobs report: metrics, log lines, typed records, checkpoints and artifacts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from ace3_control.models.base import Base, new_id, utcnow


class JobMetric(Base):
    __tablename__ = "job_metrics"
    __table_args__ = (
        UniqueConstraint("job_id", "step", "name", name="uq_job_metrics_job_step_name"),
    )

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[float | None] = mapped_column(Float)
    name: Mapped[str] = mapped_column(String(200))
    value: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobLog(Base):
    __tablename__ = "job_logs"
    __table_args__ = (Index("ix_job_logs_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int | None] = mapped_column(Integer)
    stream: Mapped[str] = mapped_column(String(8))
    line: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobRecord(Base):
    """A typed record of the job's events file the service keeps (validated by
    ``ace3.config.events``): ``type`` is ``"instability"`` (the instability guard found an
    unstable step) or ``"preempted"`` (SIGTERM stopped the attempt after a checkpoint);
    ``payload`` is the record itself (its JSON). Bounded per attempt by the worker."""

    __tablename__ = "job_records"
    __table_args__ = (Index("ix_job_records_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(32))
    step: Mapped[int] = mapped_column(Integer)
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobCheckpoint(Base):
    __tablename__ = "job_checkpoints"
    __table_args__ = (
        UniqueConstraint("job_id", "step", "name", name="uq_job_checkpoints_job_step_name"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int | None] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(255))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(500))
    metrics: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # keep_best_checkpoint: the monitored metric's value at this step, and whether this is the
    # job's best checkpoint by it (at most one per job; never pruned).
    monitor_value: Mapped[float | None] = mapped_column(Float)
    best: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class JobArtifact(Base):
    """The newest synced version of one file the job wrote under ``output/artifacts/``.

    ``path`` is relative to that directory (posix separators). Each change of the file's bytes
    is a new ``version`` stored under a key holding the job id and the sha256; the previous
    version's bytes are deleted from the store once no row of the job names them.
    """

    __tablename__ = "job_artifacts"
    __table_args__ = (UniqueConstraint("job_id", "path", name="uq_job_artifacts_job_path"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(String(1024))
    attempt: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(Integer, default=1)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    storage_key: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
