"""SQLAlchemy 2.0 tables: owners and their keys, models, datasets, jobs and what jobs report."""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


class JobState(enum.StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES = frozenset({JobState.STARTING, JobState.RUNNING, JobState.CANCELLING})


class JobPriority(enum.StrEnum):
    """The order in which queued jobs are claimed (``ace3_control.scheduling``)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite hands back naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime: use ace3_control.models.utcnow()")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: UTCDateTime}


class Owner(Base):
    __tablename__ = "owners"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Quotas (``ace3 owners set-quota``; None: no limit): jobs holding a worker at once, and
    # processes (GPUs, or processes on CPU workers) those jobs run together. A job over quota
    # waits in the queue.
    max_running_jobs: Mapped[int | None] = mapped_column(Integer, default=None)
    max_gpus: Mapped[int | None] = mapped_column(Integer, default=None)
    # The highest priority the owner's jobs may ask for (``high`` or ``normal``); None:
    # the service's default (``ACE3_DEFAULT_MAX_PRIORITY``, ``normal``): ``high`` is an admin's
    # grant, so no owner jumps every other owner's queue by asking.
    max_priority: Mapped[str | None] = mapped_column(String(8), default=None)
    # When a worker last claimed one of the owner's jobs: owners served longest ago go first
    # among equals (fair share).
    last_claimed_at: Mapped[datetime | None] = mapped_column(default=None)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    lookup_prefix: Mapped[str] = mapped_column(String(16), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class StoredModel(Base):
    """Uploaded model code: a .py file or an archive of a package. Stored once per owner."""

    __tablename__ = "models"
    __table_args__ = (
        UniqueConstraint("owner_id", "sha256", "variant", name="uq_models_owner_sha256_variant"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    filename: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))
    entry_module: Mapped[str | None] = mapped_column(String(200))
    factory: Mapped[str] = mapped_column(String(200))
    # The same bytes used through another factory or entry module are another model.
    variant: Mapped[str] = mapped_column(String(401))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)


class StoredDataset(Base):
    """An uploaded dataset: one file, or a directory (extracted from the uploaded archive)."""

    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("owner_id", "sha256", name="uq_datasets_owner_sha256"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    filename: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))
    format: Mapped[str] = mapped_column(String(32))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)


class UploadedCheckpoint(Base):
    """Model weights uploaded from the caller's machine (a safetensors file, checked to hold
    only tensors), to start jobs from (``init_from``). Stored once per owner."""

    __tablename__ = "uploaded_checkpoints"
    __table_args__ = (
        UniqueConstraint("owner_id", "sha256", name="uq_uploaded_checkpoints_owner_sha256"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    filename: Mapped[str] = mapped_column(String(255))
    tensors: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)


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

    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # Retention (``ace3_server.retention``): when the finished job's log lines were archived to
    # the store and deleted, and when its metric points were deleted.
    logs_archived_at: Mapped[datetime | None] = mapped_column(default=None)
    metrics_pruned_at: Mapped[datetime | None] = mapped_column(default=None)


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


class NodeState(enum.StrEnum):
    """Where one node of a multi-node attempt is (``job_nodes.state``)."""

    WAITING = "waiting"  # claimed: the worker waits for the rest of the gang
    RUNNING = "running"  # the gang is complete and this node's torchrun was launched
    EXITED = "exited"  # its torchrun ended: exit_code, error and stopped say how
    LEFT = "left"  # released without running (the gang never completed, cancel, attempt over)


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


class SearchState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TrialState(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    PRUNED = "pruned"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_SEARCH_STATES = frozenset({SearchState.QUEUED, SearchState.RUNNING, SearchState.CANCELLING})


class Search(Base):
    """A hyperparameter search; its driver lease says which API process advances it."""

    __tablename__ = "searches"
    __table_args__ = (
        UniqueConstraint("owner_id", "idempotency_key", name="uq_searches_owner_idempotency_key"),
        Index("ix_searches_owner_created", "owner_id", "created_at", "id"),
        Index("ix_searches_state", "state"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"))
    name: Mapped[str | None] = mapped_column(String(200))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"))
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"))
    validation_dataset_id: Mapped[str | None] = mapped_column(ForeignKey("datasets.id"))
    config: Mapped[dict[str, Any]]
    model_kwargs: Mapped[dict[str, Any]]
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default=SearchState.QUEUED)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    driver_id: Mapped[str | None] = mapped_column(String(200))
    driver_lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class SearchTrial(Base):
    """One trial: the parameters Optuna chose, the job that trains them, and what it reported."""

    __tablename__ = "search_trials"
    __table_args__ = (
        UniqueConstraint("search_id", "number", name="uq_search_trials_search_number"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    search_id: Mapped[str] = mapped_column(
        ForeignKey("searches.id", ondelete="CASCADE"), index=True
    )
    number: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]]
    sampler_params: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16), default=TrialState.RUNNING)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"))
    value: Mapped[float | None] = mapped_column(Float)
    intermediate_values: Mapped[dict[str, Any]]
    system_attrs: Mapped[dict[str, Any]]
    judged_epochs: Mapped[int] = mapped_column(Integer, default=0)
    epochs_run: Mapped[int] = mapped_column(Integer, default=0)
    prune_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    checkpoint_id: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class DeliveryState(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class Webhook(Base):
    """A URL an owner asked ACE3 to POST its job and search state changes to, signed with
    ``secret`` (HMAC-SHA256; shown to the owner once, at creation)."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_owner_created", "owner_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(String(2048))
    # Event names (``job.succeeded``) and wildcards (``job.*``) this webhook subscribes to.
    events: Mapped[list[str]] = mapped_column(JSON)
    secret: Mapped[str] = mapped_column(String(100))
    disabled: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookEvent(Base):
    """The outbox: one row per job or search state change of an owner who has a webhook.

    Written by database triggers on ``jobs`` and ``searches`` (migration 0012) in the same
    transaction as the state change, whichever process makes it; the API's delivery loop turns
    each row into one ``webhook_deliveries`` row per subscribed webhook and deletes it."""

    __tablename__ = "webhook_events"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    owner_id: Mapped[str] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(16))  # "job" or "search"
    subject_id: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16))
    previous_state: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One event for one webhook, and every attempt to POST it (``history``)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_webhook_created", "webhook_id", "created_at", "id"),
        Index("ix_webhook_deliveries_state_next", "state", "next_attempt_at"),
    )

    # Also the body's ``id``: the same on every retry, so receivers can drop duplicates.
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    owner_id: Mapped[str] = mapped_column(String(32))
    event_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16), default=DeliveryState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    last_duration_ms: Mapped[float | None] = mapped_column(Float, default=None)
    # One entry per attempt: {"at", "status_code", "error", "duration_ms"}.
    history: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)
