"""The jobs table: what a job runs, where its state stands, and how it ended."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from ace3_control.models.base import Base, new_id, utcnow
from ace3_control.models.states import JobPriority, JobState


class Job(Base):
    """A training job and its state machine; ``attempt`` is the fencing token of every update."""

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner_id", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
        Index("ix_jobs_owner_created", "owner_id", "created_at", "id"),
        Index("ix_jobs_state_lease", "state", "lease_expires_at"),
        Index("ix_jobs_state_owner", "state", "owner_id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"))
    name: Mapped[str | None] = mapped_column(String(200))
    # high | normal | low: claims go by priority first (``ace3_control.scheduling``).
    priority: Mapped[str] = mapped_column(
        String(8), default=JobPriority.NORMAL, server_default=JobPriority.NORMAL.value
    )
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"))
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"))
    validation_dataset_id: Mapped[str | None] = mapped_column(ForeignKey("datasets.id"))
    config: Mapped[dict[str, Any]]
    model_kwargs: Mapped[dict[str, Any]]
    num_processes: Mapped[int] = mapped_column(Integer)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64))
    # A stored checkpoint (of any job of this owner) that attempt 1 resumes from; later attempts
    # resume from this job's own newest checkpoint when it has one. The foreign key keeps it from
    # being deleted (keep-last-N pruning skips it).
    resume_from_checkpoint_id: Mapped[str | None] = mapped_column(
        ForeignKey("job_checkpoints.id", name="fk_jobs_resume_from_checkpoint_id", use_alter=True),
        default=None,
    )

    state: Mapped[str] = mapped_column(String(16), default=JobState.QUEUED)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    max_retries: Mapped[int] = mapped_column(Integer, default=0)
    # How many attempts ran out of memory inside a training step: each one halved the
    # micro-batch of the next (job.json's micro_batch_split = 2 ** halvings). They do not count
    # against max_retries.
    micro_batch_halvings: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # How many attempts were preempted (their worker was drained: SIGTERM to ``ace3 worker``):
    # each one checkpointed and the job was re-queued. They do not count against max_retries.
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    worker_id: Mapped[str | None] = mapped_column(String(200))
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    heartbeat_at: Mapped[datetime | None] = mapped_column(default=None)
    # When the job was last published; re-publishing (the reconciler, a worker handing it back)
    # moves it.
    enqueued_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When the job last entered ``queued`` (created, or re-queued for a retry): how long it has
    # waited for a worker that can run it. Re-publishing leaves it.
    queued_at: Mapped[datetime] = mapped_column(default=utcnow)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    final_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The run plan of the newest attempt's ``start`` record (ace3.config.events.RunPlan, validated by
    # the worker): what the SDK's progress bar counts to.
    plan: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # The packages the job adds to the worker's Python: config.requirements and the model
    # package's requirements.txt, merged and normalised by the API (ace3.config.requirements);
    # None: none. environment_hash: the environment a worker resolved them to (environments).
    requirements: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    environment_hash: Mapped[str | None] = mapped_column(String(64), default=None)
    # What a ``starting`` job is doing before its processes run ("preparing_environment");
    # None otherwise. Not a state: the fair queue, webhooks and the reconciler key on states.
    phase: Mapped[str | None] = mapped_column(String(32), default=None)
    # The model a succeeded run's export (artifacts/huggingface/) was registered as, written
    # with the ``succeeded`` state in one transaction (ace3_worker.export_registration); None:
    # no export, or not succeeded.
    fine_tuned_model_id: Mapped[str | None] = mapped_column(ForeignKey("models.id"), default=None)
    # What a job created through the OpenAI-compatible API was asked for (suffix, method,
    # hyperparameters, metadata), shown back by that API; None for other jobs.
    fine_tune_request: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)

    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # Retention (``ace3_server.retention``): when the finished job's log lines were archived to
    # the store and deleted, and when its metric points were deleted.
    logs_archived_at: Mapped[datetime | None] = mapped_column(default=None)
    metrics_pruned_at: Mapped[datetime | None] = mapped_column(default=None)
