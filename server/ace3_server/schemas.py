"""Request and response bodies of the REST API (the training config itself is ace3.config's)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from ace3.config import TrainingConfig
from ace3.config.events import RunPlan
from ace3.config.states import JobState, Priority, SearchState, TrialState, WaitingReason
from ace3.hp import HPConfig
from ace3_server.environment_schemas import JobEnvironmentOut

Item = TypeVar("Item")


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True, protected_namespaces=())


class Page(BaseModel, Generic[Item]):
    data: list[Item]
    next_cursor: str | None = None


_HF = "kind huggingface (a Hugging Face model directory; null for the others): "


class ModelOut(_Out):
    id: str
    name: str
    filename: str
    kind: str = Field(description="file (a .py), archive (a package) or huggingface.")
    entry_module: str | None
    factory: str
    sha256: str
    size_bytes: int
    requirements: list[str] | None = Field(
        None,
        description="A package's requirements.txt, read at upload (canonical PEP 508 entries): "
        "merged into the requirements of every job that trains it; null: none.",
    )
    architectures: list[str] | None = Field(None, description=f"{_HF}config.json's classes.")
    parameter_count: int | None = Field(None, description=f"{_HF}the parameters in its weights.")
    module_names: list[str] | None = Field(None, description=f"{_HF}the modules owning weights.")
    hf_config: dict[str, Any] | None = Field(
        None,
        description=f"{_HF}model_type, max_position_embeddings, has_tokenizer, has_chat_template.",
    )
    source_job_id: str | None = Field(
        None, description="The job whose export this model is (a fine-tuned model); null: uploaded."
    )
    created_at: datetime


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model_id: str = Field(..., min_length=1, max_length=64)
    dataset_id: str = Field(..., min_length=1, max_length=64)
    validation_dataset_id: str | None = Field(None, min_length=1, max_length=64)
    config: TrainingConfig = Field(default_factory=TrainingConfig)
    model_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the model factory."
    )
    name: str | None = Field(None, max_length=200)
    priority: Priority = Field(
        "normal",
        description="Claim order: high before normal before low; owners take turns within one.",
    )
    resume_from_checkpoint: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="A stored checkpoint's id (one of your jobs'): the job starts from it, with "
        "its weights, optimizer state, step and epoch. Needs the process count that wrote it.",
    )


class JobOut(_Out):
    id: str
    name: str | None
    priority: Priority = "normal"
    state: JobState
    queue_position: int | None = Field(
        None,
        description="A queued job's place in claim order (1 = next; GET /v1/queue); else null.",
    )
    waiting_reason: WaitingReason | None = Field(
        None,
        description="Why a queued job waits: quota (its owner is at max_running_jobs or "
        "max_gpus), priority (jobs that may run are ahead of it), capacity (it is next and waits "
        "for a free worker that fits it); null when not queued.",
    )
    attempt: int
    preemptions: int = Field(
        0, description="Attempts that were preempted (worker drained); not counted as retries."
    )
    model_id: str
    dataset_id: str
    validation_dataset_id: str | None
    config: dict[str, Any]
    model_kwargs: dict[str, Any]
    num_processes: int
    cancel_requested: bool
    exit_code: int | None
    error: str | None
    final_metrics: dict[str, Any] | None
    plan: RunPlan | None = None
    resume_from_checkpoint: str | None = Field(None, validation_alias="resume_from_checkpoint_id")
    requirements: list[str] | None = Field(
        None,
        description="The packages the job adds to the worker's Python: config.requirements "
        "merged with its model package's requirements.txt (canonical); null: none.",
    )
    phase: str | None = Field(
        None,
        description="What a starting job is doing before its processes run "
        "('preparing_environment'); null otherwise.",
    )
    fine_tuned_model_id: str | None = Field(None, description="The model its export became.")
    environment: JobEnvironmentOut | None = Field(
        None, description="The environment its requirements resolved to; null until resolved."
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobProgress(BaseModel):
    """Where a job has got to: its newest reported metric's step and epoch (1-based)."""

    step: int
    epoch: float | None


class JobListItem(JobOut):
    progress: JobProgress | None = Field(
        None,
        description="The newest reported step and epoch (null before the first metric); "
        "compare with config.epochs / config.max_steps.",
    )


class MetricOut(_Out):
    id: int
    step: int
    epoch: float | None
    name: str
    value: float
    created_at: datetime


class MetricList(BaseModel):
    data: list[MetricOut]


class LogOut(_Out):
    seq: int = Field(validation_alias="id")
    attempt: int
    rank: int | None
    stream: str
    line: str
    created_at: datetime


class LogList(BaseModel):
    data: list[LogOut]
    next_after: int


class RecordOut(_Out):
    """A typed record the job reported (``type``: ``"instability"``, ``"preempted"`` or
    ``"eval_samples"``);
    ``record`` is the record itself, as ``ace3.config.events`` defines it."""

    id: int
    attempt: int
    type: str
    step: int
    record: dict[str, Any] = Field(validation_alias="payload")
    created_at: datetime


class RecordList(BaseModel):
    data: list[RecordOut]
    next_after: int


class CheckpointOut(_Out):
    id: str
    job_id: str
    name: str
    step: int
    epoch: int | None
    attempt: int
    sha256: str
    size_bytes: int
    metrics: dict[str, Any]
    created_at: datetime
    monitor_value: float | None = Field(
        None,
        description="keep_best_checkpoint: the checkpoint_monitor metric's value at this step "
        "(null: not measured).",
    )
    best: bool = Field(
        False,
        description="keep_best_checkpoint: the job's best checkpoint by checkpoint_monitor (at "
        "most one; never pruned).",
    )


class UploadedCheckpointOut(_Out):
    """Model weights uploaded to start jobs from (``config.init_from_checkpoint_id``)."""

    id: str
    name: str
    filename: str
    tensors: int
    sha256: str
    size_bytes: int
    created_at: datetime


class CheckpointList(BaseModel):
    data: list[CheckpointOut]


class ArtifactOut(_Out):
    """The newest synced version of a file the job wrote under ``output/artifacts/``."""

    path: str = Field(description="Relative to the job's artifacts directory, '/'-separated.")
    size_bytes: int
    sha256: str
    version: int = Field(description="1 for the first synced bytes, +1 on every change.")
    attempt: int = Field(description="The attempt whose files these bytes are.")
    updated_at: datetime


class ArtifactList(BaseModel):
    data: list[ArtifactOut]


class SearchCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model_id: str = Field(..., min_length=1, max_length=64)
    dataset_id: str = Field(..., min_length=1, max_length=64)
    validation_dataset_id: str | None = Field(None, min_length=1, max_length=64)
    config: HPConfig
    model_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Fixed keyword arguments of the model factory."
    )
    name: str | None = Field(None, max_length=200)


class SearchTrialOut(_Out):
    id: str
    number: int
    state: TrialState
    params: dict[str, Any]
    job_id: str | None
    value: float | None
    intermediate_values: dict[str, float]
    epochs_run: int
    checkpoint_id: str | None
    error: str | None
    created_at: datetime
    finished_at: datetime | None


class SearchTrialList(BaseModel):
    data: list[SearchTrialOut]


class SearchOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    id: str
    name: str | None
    state: SearchState
    model_id: str
    dataset_id: str
    validation_dataset_id: str | None
    config: dict[str, Any]
    model_kwargs: dict[str, Any]
    cancel_requested: bool
    error: str | None
    trial_budget: int
    trials_created: int
    trials_running: int
    trials_succeeded: int
    trials_pruned: int
    trials_failed: int
    epochs_run: int
    best_trial: SearchTrialOut | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class WorkerOut(_Out):
    id: str
    hostname: str
    device_kind: str = Field(description="cuda or cpu.")
    device_count: int = Field(
        description="The most processes one job may run on this worker: its GPUs, or on a CPU "
        "worker ACE3_WORKER_CPU_PROCESSES."
    )
    slots: int = Field(description="Jobs it runs at once (ACE3_WORKER_SLOTS).")
    queue: str
    started_at: datetime
    last_seen_at: datetime


class WorkerList(BaseModel):
    data: list[WorkerOut]


class QueuedJobOut(BaseModel):
    id: str
    name: str | None
    priority: Priority
    waiting_reason: WaitingReason
    position: int = Field(
        description="1 = the next job a worker takes: 1 + the queued jobs of all owners ahead of "
        "it in claim order."
    )
    num_processes: int
    created_at: datetime
    queued_at: datetime = Field(description="When it last entered the queue (created, re-queued).")
    enqueued_at: datetime = Field(description="When it was last published to the workers.")


class QueueOut(BaseModel):
    data: list[QueuedJobOut] = Field(description="The caller's queued jobs, in claim order.")
    queued: int = Field(description="Queued jobs of all owners (others' are only counted).")
    running: int = Field(description="Jobs of all owners that hold a worker slot now.")
