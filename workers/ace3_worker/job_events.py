"""The records a job writes to ``output/events.jsonl``, validated before the worker acts on any.

A job runs a stranger's code, and rank 0's events file is written by the same process as that
code: every record is untrusted input. Each line is parsed into one of the models below
(unknown keys and types refused, every string and collection bounded, every number finite and
in range); a line that does not validate is refused with a reason, which the supervisor stores
as a warning in the job's log, and nothing else happens. What a checkpoint record may point at
is checked separately (:func:`ace3_worker.reports.checkpoint_problem`).
"""

from __future__ import annotations

import json
import math
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


def _finite_values(values: dict[str, Any]) -> dict[str, Any]:
    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name} is not a finite number")
    return values


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StartRecord(_Record):
    """The run's plan, written once it is known (before the first step)."""

    type: Literal["start"]
    total_steps: Count
    steps_per_epoch: Count | None = None
    epochs: Count | None = None
    world_size: Annotated[int, Field(ge=1, le=1 << 20, strict=True)] | None = None
    resumed_from_step: Count | None = None


class MetricsRecord(_Record):
    type: Literal["metrics"]
    step: Step
    epoch: Epoch | None = None
    # null: a value that was not finite (the engine writes NaN/inf as null)
    values: dict[MetricName, float | None] = Field(max_length=MAX_METRICS_PER_RECORD)

    @field_validator("values")
    @classmethod
    def _finite(cls, values: dict[str, float | None]) -> dict[str, float | None]:
        return _finite_values(values)


class CheckpointRecord(_Record):
    type: Literal["checkpoint"]
    step: Step
    epoch: Epoch | None = None
    name: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    path: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    size_bytes: Annotated[int, Field(ge=0, strict=True)]
    metrics: dict[MetricName, float | None] = Field(
        default_factory=dict, max_length=MAX_METRICS_PER_RECORD
    )

    @field_validator("metrics")
    @classmethod
    def _finite(cls, values: dict[str, float | None]) -> dict[str, float | None]:
        return _finite_values(values)


class SummaryRecord(_Record):
    type: Literal["summary"]
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

    type: Literal["nonfinite_loss"]
    step: Step
    reported_at_step: Step | None = None
    epoch: Epoch | None = None
    metric: MetricName = "train_loss"
    value: Literal["nan", "inf", "-inf"]


JobRecord = Annotated[
    StartRecord | MetricsRecord | CheckpointRecord | SummaryRecord | NonFiniteLossRecord,
    Field(discriminator="type"),
]
_RECORD = TypeAdapter(JobRecord)


class RefusedRecord(BaseModel):
    """A line of the events file that the worker did not accept, and why."""

    reason: str
    excerpt: str


def _reason(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the record"
    return f"{where}: {first['msg']}"


def parse_record(line: bytes) -> JobRecord | RefusedRecord:
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
