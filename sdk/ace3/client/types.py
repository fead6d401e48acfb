"""The typed objects the API returns: Model, Dataset, Job (and JobState), Metric, LogLine,
JobRecord, Checkpoint, Artifact, Worker, Environment, and the events of a job's live stream. Lenient on purpose: a field
a newer server adds must not break an older SDK."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ace3.config.events import EvalSamplesRecord, InstabilityRecord, PreemptedRecord, RunPlan
from ace3.config.states import TERMINAL_STATES as TERMINAL_STATES
from ace3.config.states import JobPriority, WaitingReason
from ace3.config.states import JobState as JobState
from ace3.config.states import RunState as RunState

if TYPE_CHECKING:
    pass


# -- response models ------------------------------------------------------------------------


class _APIObject(BaseModel):
    """Lenient on purpose: a field a newer server adds must not break an older SDK."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())


class Model(_APIObject):
    id: str
    name: str | None = None
    filename: str | None = None
    kind: str = "file"  # "file", "archive" or "huggingface" (a Hugging Face model directory)
    entry_module: str | None = None
    factory: str = "build_model"
    sha256: str
    size_bytes: int | None = None
    # A package's requirements.txt, as the service read it at upload (canonical PEP 508
    # entries): merged into every job that trains it. None: none.
    requirements: list[str] | None = None
    # kind "huggingface" only (None otherwise): config.json's architectures, the parameters
    # its safetensors weights hold, the modules owning them (tensor names less their last
    # component, sorted), and {model_type, max_position_embeddings, has_tokenizer,
    # has_chat_template}
    architectures: list[str] | None = None
    parameter_count: int | None = None
    module_names: list[str] | None = None
    hf_config: dict[str, Any] | None = None
    source_job_id: str | None = None  # the job whose export this model is; None: uploaded
    created_at: datetime | None = None


class Dataset(_APIObject):
    id: str
    name: str | None = None
    filename: str | None = None
    # "file" or "directory" (uploaded), "remote" (registered from a bucket prefix), "shards"
    kind: str = "file"
    # A file's (pt, npz, csv, jsonl), "directory", or a sharded dataset's stream format
    # (webdataset, parquet, jsonl, tokens)
    format: str | None = None
    sha256: str  # a sharded dataset's: its shard manifest's digest
    size_bytes: int | None = None
    uri: str | None = None  # a remote dataset's source, s3://bucket/prefix/
    shard_count: int | None = None
    samples: int | None = None  # a sharded dataset's, when its format records them
    # The kind of its text records ("chat", "prompt_completion", "text"): named with records=,
    # or told by an uploaded .jsonl file's first record; None when none is known
    records: str | None = None
    created_at: datetime | None = None


class JobProgress(_APIObject):
    """Where a listed job has got to: its newest reported metric's step and epoch."""

    step: int
    epoch: float | None = None


class Package(_APIObject):
    """A distribution an environment adds to the worker's Python."""

    name: str
    version: str


class JobEnvironment(_APIObject):
    """The environment a job's requirements resolved to (``job.environment``): its ``hash``
    (``client.environments.get(hash)`` for all of it), ``state`` (building, ready or failed;
    None when its record is gone) and the ``packages`` it adds."""

    hash: str
    state: str | None = None
    packages: list[Package] = Field(default_factory=list)


class Environment(_APIObject):
    """A per-job Python environment (``GET /v1/environments/{hash}``): the ``requirements`` it
    was built for, the ``packages`` they resolved to on top of the worker's own, the Python and
    platform it was built for, its size and build time, and why its build failed (``error``)."""

    hash: str
    state: str
    requirements: list[str] = Field(default_factory=list)
    packages: list[Package] = Field(default_factory=list)
    python: str | None = None
    platform: str | None = None
    size_bytes: int | None = None
    build_seconds: float | None = None
    error: str | None = None
    created_at: datetime | None = None
    ready_at: datetime | None = None


class Job(_APIObject):
    id: str
    name: str | None = None
    # high | normal | low: the order in which the service's workers claim queued jobs.
    priority: JobPriority | str = Field(JobPriority.NORMAL, union_mode="left_to_right")
    state: JobState | str = Field(union_mode="left_to_right")
    # A queued job (GET /v1/jobs/{id}): its place in claim order (1 = next) and why it waits
    # (quota, capacity or priority); None otherwise.
    queue_position: int | None = None
    waiting_reason: WaitingReason | str | None = Field(None, union_mode="left_to_right")
    attempt: int = 0
    # Attempts that were preempted (their worker was drained) and re-queued; the retry budget
    # (the service's max_retries) does not count them.
    preemptions: int = 0
    model_id: str | None = None
    dataset_id: str | None = None
    validation_dataset_id: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    model_kwargs: dict[str, Any] | None = None
    num_processes: int | None = None
    cancel_requested: bool = False
    exit_code: int | None = None
    error: str | None = None
    final_metrics: dict[str, Any] | None = None
    # The run's plan once its first attempt started (total optimizer steps, epochs, ...).
    plan: RunPlan | None = None
    resume_from_checkpoint: str | None = None
    # The packages the job adds to the worker's Python (config.requirements merged with its
    # model package's requirements.txt); None: none.
    requirements: list[str] | None = None
    # What a starting job is doing before its processes run ("preparing_environment"); None
    # otherwise (not a state: the job stays "starting").
    phase: str | None = None
    # The model a succeeded run's Hugging Face export (artifacts/huggingface/) was registered
    # as: fine-tune it again, or download it; None: no export, or not succeeded.
    fine_tuned_model_id: str | None = None
    # The environment its requirements resolved to; None until a worker resolved them.
    environment: JobEnvironment | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    # In job lists (GET /v1/jobs): the newest reported step and epoch; None elsewhere.
    progress: JobProgress | None = None

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class Metric(_APIObject):
    id: int | str | None = None
    step: int
    epoch: float | None = None
    name: str
    value: float
    created_at: datetime | None = None


class LogLine(_APIObject):
    seq: int
    attempt: int | None = None
    rank: int | None = None
    stream: str | None = None
    line: str
    created_at: datetime | None = None

    def format(self) -> str:
        """The line prefixed with its rank (``[rank 0] ...``) unless it already is."""
        if self.rank is None or self.line.startswith("[rank "):
            return self.line
        return f"[rank {self.rank}] {self.line}"


class JobRecord(_APIObject):
    """A typed record the job reported (``GET /v1/jobs/{id}/records``, the stream's ``record``
    events): ``type`` ``"instability"`` (``record`` an
    :class:`~ace3.config.events.InstabilityRecord`: the instability guard found an unstable
    step), ``"preempted"`` (a :class:`~ace3.config.events.PreemptedRecord`) or
    ``"eval_samples"`` (an :class:`~ace3.config.events.EvalSamplesRecord`: what the model
    completed for ``eval_prompts`` at a validation). A record this SDK does not know (a newer
    server's) stays a dict."""

    id: int
    attempt: int | None = None
    type: str
    step: int | None = None
    record: InstabilityRecord | PreemptedRecord | EvalSamplesRecord | dict[str, Any] = Field(
        union_mode="left_to_right"
    )
    created_at: datetime | None = None


class Checkpoint(_APIObject):
    id: str
    job_id: str | None = None
    name: str
    step: int | None = None
    epoch: float | None = None
    attempt: int | None = None
    sha256: str | None = None
    size_bytes: int | None = None
    metrics: dict[str, Any] | None = None
    created_at: datetime | None = None
    monitor_value: float | None = None  # keep_best_checkpoint: checkpoint_monitor at this step
    best: bool = False  # keep_best_checkpoint: the job's best checkpoint (never pruned)
    # Uploaded weights (client.checkpoints.upload, POST /v1/checkpoints) only: the file's name
    # and its tensor count; a job's checkpoints have job_id, step, epoch and attempt instead.
    filename: str | None = None
    tensors: int | None = None


class Artifact(_APIObject):
    """A file the job wrote under its artifacts directory (``artifact://`` paths), as last
    synced by the worker: ``version`` grows by one each time its bytes changed."""

    path: str
    size_bytes: int
    sha256: str
    version: int = 1
    attempt: int | None = None
    updated_at: datetime | None = None


class Worker(_APIObject):
    """A live worker and what one job may use on it: ``device_count`` processes on
    ``device_kind`` (``"cuda"``: its GPUs; ``"cpu"``: the CPU processes it runs)."""

    id: str
    hostname: str | None = None
    device_kind: str
    device_count: int
    slots: int = 1
    queue: str | None = None
    started_at: datetime | None = None
    last_seen_at: datetime | None = None

    def fits(self, num_gpus: int, backend: str = "auto") -> bool:
        """Whether a job with this ``num_gpus`` and ``backend`` can run on this worker (the
        rule the server admits jobs by)."""
        if backend == "nccl" and self.device_kind != "cuda":
            return False
        return num_gpus <= self.device_count


@dataclass
class LogPage:
    """One page of ``GET /v1/jobs/{id}/logs``; pass ``next_after`` as ``after`` for more."""

    data: list[LogLine]
    next_after: int | None


@dataclass
class RecordPage:
    """One page of ``GET /v1/jobs/{id}/records``; pass ``next_after`` as ``after`` for more."""

    data: list[JobRecord]
    next_after: int | None


@dataclass
class JobEvent:
    """One event of ``GET /v1/jobs/{id}/events``.

    ``type`` is ``state`` or ``end`` (``data`` a :class:`Job`), ``metric`` (a
    :class:`Metric`), ``log`` (a :class:`LogLine`) or ``record`` (a :class:`JobRecord`: an
    instability or preemption); an event type this SDK does not know keeps its raw decoded
    JSON. ``id`` is the resume cursor ``"<metrics_after>:<logs_after>[:<records_after>]"``.
    """

    type: str
    data: Any
    id: str | None = None


_EVENT_MODELS: dict[str, type[BaseModel]] = {
    "state": Job,
    "end": Job,
    "metric": Metric,
    "log": LogLine,
    "record": JobRecord,
}
