"""The run's event log (``output/events.jsonl``): the contract between the engine, the worker
and the SDK.

One JSON object a line, each one of the records below, told apart by ``type``:

- ``start``: the run's plan, before its first step (:class:`StartRecord`);
- ``metrics``: values reported at a step (:class:`MetricsRecord`);
- ``checkpoint``: a checkpoint file written (:class:`CheckpointRecord`);
- ``nonfinite_loss``: the training loss became NaN or infinite; the run then stops;
- ``instability``: the instability guard found an unstable step (:class:`InstabilityRecord`);
- ``preempted``: SIGTERM stopped the run after a checkpoint (:class:`PreemptedRecord`);
- ``rank_failure``: a rank raised an exception and exits (:class:`RankFailureRecord`);
- ``eval_samples``: what the model completed for ``eval_prompts`` at a validation
  (:class:`EvalSamplesRecord`);
- ``summary``: the final metrics, last (:class:`SummaryRecord`).

The engine builds these models and writes :func:`encode_record`'s line (rank 0 only, except a
``rank_failure`` record: every rank that fails appends its own, one short line in one write to
a file opened for appending, so lines of several ranks never mix); an
in-process run's collector receives the same objects. The worker reads the file back with
:func:`parse_record`: a job runs a stranger's code, and rank 0's events file is written by the
same process as that code, so every line is untrusted input there. Unknown keys and types are
refused, every string and collection is bounded, every number finite and in range; a line
that does not validate is refused with a reason (the worker stores it as a warning in the
job's log, and nothing else happens). The ``instability``, ``preempted`` and ``eval_samples`` records
are kept as typed rows (``GET /v1/jobs/{id}/records``, the SDK's ``client.jobs.records``). What a checkpoint record may point at is checked by the
worker separately (:func:`ace3_worker.checkpoints.checkpoint_problem`). The worker keeps the start
record's plan on the job (:class:`RunPlan`), which is how the SDK's progress bar knows the
total from step 1.

Torch-free: the SDK, the server and the worker import it without the training extra.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    field_validator,
)

MAX_STEP = (1 << 31) - 1  # job_metrics.step and job_checkpoints.step are 32-bit integers
MAX_LINE_BYTES = 256 * 1024
MAX_METRICS_PER_RECORD = 256

Step = Annotated[int, Field(ge=0, le=MAX_STEP, strict=True)]
Count = Annotated[int, Field(ge=0, le=MAX_STEP, strict=True)]
Epoch = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]
MetricName = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
]
Scalar = float | int | bool | None | Annotated[str, StringConstraints(max_length=500)]
# Text a record carries into the job's log, the API and a terminal: no control characters
# (C0, DEL, C1) and no line or paragraph separators (U+2028, U+2029).
PLAIN_TEXT_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\x{2028}\x{2029}]+$"
PLAIN_TEXT_OR_EMPTY = r"^[^\x00-\x1f\x7f-\x9f\x{2028}\x{2029}]*$"
MAX_FAILURE_MESSAGE_CHARS = 1000
_NOT_PLAIN = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def plain_text(text: str, limit: int) -> str:
    """``text`` as a record may carry it: each run of control characters or line separators
    becomes one space, cut to ``limit`` characters."""
    return _NOT_PLAIN.sub(" ", text).strip()[:limit]


def _finite_values(values: dict[str, Any]) -> dict[str, Any]:
    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name} is not a finite number")
    return values


def finite_or_none(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every NaN or infinite float replaced by None (how a record holds a
    value that was not finite: the line stays strict JSON)."""
    return {
        name: None if isinstance(value, float) and not math.isfinite(value) else value
        for name, value in values.items()
    }


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunPlan(_Record):
    """What a run plans, known before its first step: ``total_steps`` counts optimizer steps
    from step 0 (a resumed run's earlier steps included) and no step of the run exceeds it.

    As the job's ``plan`` (API and SDK) unknown keys are ignored, so an older SDK reads a newer
    server's plan; the record a job writes (:class:`StartRecord`) refuses them."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    total_steps: Count
    steps_per_epoch: Count | None = None
    epochs: Count | None = None
    world_size: Annotated[int, Field(ge=1, le=1 << 20, strict=True)] | None = None
    resumed_from_step: Count | None = None


class StartRecord(RunPlan):
    """The run's plan, written once it is known (before the first step)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: Literal["start"] = "start"

    def plan(self) -> RunPlan:
        return RunPlan.model_validate(self.model_dump(exclude={"type"}))


class MetricsRecord(_Record):
    type: Literal["metrics"] = "metrics"
    step: Step
    epoch: Epoch | None = None
    # null: a value that was not finite (the engine writes NaN/inf as null)
    values: dict[MetricName, float | None] = Field(max_length=MAX_METRICS_PER_RECORD)

    @field_validator("values")
    @classmethod
    def _finite(cls, values: dict[str, float | None]) -> dict[str, float | None]:
        return _finite_values(values)


class CheckpointRecord(_Record):
    type: Literal["checkpoint"] = "checkpoint"
    step: Step
    epoch: Epoch | None = None
    name: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    path: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    size_bytes: Annotated[int, Field(ge=0, strict=True)]
    metrics: dict[MetricName, float | None] = Field(
        default_factory=dict, max_length=MAX_METRICS_PER_RECORD
    )
    # keep_best_checkpoint: the monitored metric, its value at this step (None: not measured)
    # and whether this checkpoint is the best so far (the worker judges again from the values).
    monitor: MetricName | None = None
    monitor_value: float | None = Field(None, allow_inf_nan=False)
    best: bool = False

    @field_validator("metrics")
    @classmethod
    def _finite(cls, values: dict[str, float | None]) -> dict[str, float | None]:
        return _finite_values(values)


class SummaryRecord(_Record):
    type: Literal["summary"] = "summary"
    final_metrics: dict[MetricName, Scalar] = Field(max_length=MAX_METRICS_PER_RECORD)
    best_val_accuracy: float | None = None
    steps: Count | None = None
    epochs: Epoch | None = None

    @field_validator("final_metrics")
    @classmethod
    def _finite(cls, values: dict[str, Any]) -> dict[str, Any]:
        return _finite_values(values)


class NonFiniteLossRecord(_Record):
    """The training loss became NaN or infinite at ``step`` (the run then stops)."""

    type: Literal["nonfinite_loss"] = "nonfinite_loss"
    step: Step
    reported_at_step: Step | None = None
    epoch: Epoch | None = None
    metric: MetricName = "train_loss"
    value: Literal["nan", "inf", "-inf"]


class InstabilityRecord(_Record):
    """The instability guard (``TrainingConfig.instability``) found optimizer step ``step``
    unstable (``reason``: what it found) and did ``action``: ``"warn"`` (applied the step),
    ``"skip"`` (dropped its update), ``"rollback"`` (dropped it and went back to the checkpoint
    of ``rolled_back_to_step``, the learning rate now multiplied by ``lr_scale``) or
    ``"stop"`` (the run then fails)."""

    type: Literal["instability"] = "instability"
    step: Step
    epoch: Epoch | None = None
    action: Literal["warn", "skip", "rollback", "stop"]
    reason: Annotated[
        str, StringConstraints(min_length=1, max_length=500, pattern=PLAIN_TEXT_PATTERN)
    ]
    loss: float | None = Field(None, allow_inf_nan=False)  # null: not finite
    grad_norm: float | None = Field(None, allow_inf_nan=False)  # null: not finite or unknown
    lr_scale: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    rolled_back_to_step: Step | None = None


class PreemptedRecord(_Record):
    """The run received SIGTERM and stopped after ``step`` (every rank agreed on it), with the
    checkpoint ``checkpoint`` (its file name; None without checkpoint files)."""

    type: Literal["preempted"] = "preempted"
    step: Step
    epoch: Epoch | None = None
    # a checkpoint file's name (step-NNNNNNNN.pt / .dcp.tar): it goes into the job's log
    checkpoint: (
        Annotated[
            str, StringConstraints(max_length=255, pattern=r"^step-[0-9]{8,}\.(pt|dcp\.tar)$")
        ]
        | None
    ) = None


class RankFailureRecord(_Record):
    """Rank ``rank`` raised ``error_type`` (``message``: its text on one line, cut) at
    ``time_ns`` (``time.time_ns()`` when the engine's entry point caught it). Every rank that
    fails writes its own, so the worker names the earliest as the failure's root cause and the
    later ones (a peer's closed connection...) as its consequences, which torchrun's error
    summary cannot tell apart (it names the first rank whose exit its agent saw, in whole
    seconds). A rank killed by a signal writes none."""

    type: Literal["rank_failure"] = "rank_failure"
    rank: Annotated[int, Field(ge=0, le=1 << 20, strict=True)]
    error_type: Annotated[
        str, StringConstraints(min_length=1, max_length=200, pattern=r"^[A-Za-z_][\w.]*$")
    ]
    message: Annotated[
        str, StringConstraints(max_length=MAX_FAILURE_MESSAGE_CHARS, pattern=PLAIN_TEXT_OR_EMPTY)
    ] = ""
    time_ns: Annotated[int, Field(ge=0, le=(1 << 63) - 1, strict=True)]


# A sample's text may hold tabs and newlines, nothing else of C0 or C1 (a NUL, a terminal's
# escape sequences); the engine writes U+FFFD in their place.
SAMPLE_TEXT_PATTERN = r"^[^\x00-\x08\x0b-\x1f\x7f-\x9f]*$"
MAX_SAMPLE_TEXT_CHARS = 8000
MAX_EVAL_SAMPLES = 16
# The typed records one page of ``GET /v1/jobs/{id}/records`` (or one read of the event stream)
# holds at most when it may hold eval_samples records (each up to MAX_LINE_BYTES): 2.5 MiB.
EVAL_SAMPLES_PAGE = 10
SampleText = Annotated[
    str, StringConstraints(max_length=MAX_SAMPLE_TEXT_CHARS, pattern=SAMPLE_TEXT_PATTERN)
]


class EvalSample(_Record):
    """One prompt of ``eval_prompts`` and what the model wrote after it (``completion_tokens``
    tokens, up to its end-of-sequence token or ``eval_max_new_tokens``). ``truncated``: the
    prompt or the completion was cut to fit the record (at most
    :data:`MAX_SAMPLE_TEXT_CHARS` characters each, the whole line at most
    :data:`MAX_LINE_BYTES` bytes)."""

    prompt: SampleText
    completion: SampleText
    completion_tokens: Count
    truncated: bool = False


class EvalSamplesRecord(_Record):
    """What the model completed (greedily) for each of ``eval_prompts`` at the validation of
    ``step``."""

    type: Literal["eval_samples"] = "eval_samples"
    step: Step
    epoch: Epoch | None = None
    max_new_tokens: Annotated[int, Field(ge=1, le=4096, strict=True)]
    samples: list[EvalSample] = Field(min_length=1, max_length=MAX_EVAL_SAMPLES)


AnyRecord = (
    StartRecord
    | MetricsRecord
    | CheckpointRecord
    | SummaryRecord
    | NonFiniteLossRecord
    | InstabilityRecord
    | PreemptedRecord
    | RankFailureRecord
    | EvalSamplesRecord
)
EventRecord = Annotated[AnyRecord, Field(discriminator="type")]
_RECORD: TypeAdapter[EventRecord] = TypeAdapter(EventRecord)


class RefusedRecord(BaseModel):
    """A line of the events file that did not validate, and why."""

    reason: str
    excerpt: str


def encode_record(record: EventRecord) -> str:
    """The record's line in the events file (without the newline)."""
    return record.model_dump_json()


def _reason(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the record"
    return f"{where}: {first['msg']}"


def parse_record(line: bytes) -> EventRecord | RefusedRecord:
    """One line of the events file, validated."""
    excerpt = line[:200].decode("utf-8", errors="replace")
    if len(line) > MAX_LINE_BYTES:
        return RefusedRecord(reason=f"longer than {MAX_LINE_BYTES} bytes", excerpt=excerpt)
    try:
        raw = json.loads(line, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        return RefusedRecord(reason=f"not JSON ({exc})"[:300], excerpt=excerpt)
    try:
        return _RECORD.validate_python(raw)
    except ValidationError as exc:
        return RefusedRecord(reason=_reason(exc)[:300], excerpt=excerpt)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# The engine echoes what it reports as metrics in its log as well (rank 0's output, read with
# client.jobs.logs): the interval line, the end-of-epoch and mid-epoch validation lines and the
# final summary. A display that prints the metrics themselves skips these lines, so that each
# value shows once. Only whole lines of the engine's exact shape match (a prefix, then nothing
# but name=value pairs): a user's own print that starts the same way is still shown.
_PAIRS = r"[A-Za-z_][\w/]*=\S+(?: [A-Za-z_][\w/]*=\S+)*"
_METRIC_ECHO = re.compile(
    r"^(?:\[rank 0\] )?(?:"
    r"step \d+ epoch \S+ train_loss=\S+ lr=\S+(?: samples/s=\S+)?"
    rf"|(?:epoch \d+ done|validation at step \d+|done): {_PAIRS}"
    r")$"
)


def echoes_metrics(line: str) -> bool:
    """Whether ``line`` is the engine's log echo of a metrics record."""
    return _METRIC_ECHO.match(line) is not None
