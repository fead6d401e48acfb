"""The rank-0 event log ``output_dir/events.jsonl``: one record a line, appended, flushed.

The records are the typed models of :mod:`ace3.config.events` (``start``, ``metrics``,
``checkpoint``, ``nonfinite_loss``, ``instability``, ``preempted``, ``eval_samples``,
``summary``), built and
validated here, so the engine cannot write a record the worker would refuse. A non-finite float (a diverged loss) is written
as ``null``. On other ranks the writer is a no-op, except for :func:`report_rank_failure`:
every rank that fails appends its own ``rank_failure`` record.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from ace3.config.events import (
    MAX_FAILURE_MESSAGE_CHARS,
    AnyRecord,
    EvalSamplesRecord,
    EventRecord,
    InstabilityRecord,
    MetricsRecord,
    NonFiniteLossRecord,
    PreemptedRecord,
    RankFailureRecord,
    StartRecord,
    SummaryRecord,
    encode_record,
    finite_or_none,
    plain_text,
)

_TYPE_NAME = re.compile(r"^[A-Za-z_][\w.]{0,199}$", re.ASCII)


class EventRecordError(ValueError):
    """A record the engine was asked to write breaks the events contract (a metric name that
    is too long, too many metrics, a step out of range...): which field, and why."""


class EventWriter:
    """Append-only JSONL writer of :mod:`ace3.config.events` records; enabled on rank 0 only."""

    def __init__(
        self,
        path: Path | None,
        enabled: bool,
        sink: Callable[[EventRecord], None] | None = None,
    ) -> None:
        """``path``: the JSONL file (None: no file); ``sink``: also called with every record
        (an in-process run collects its history this way)."""
        self.path = path
        self.enabled = enabled
        self._sink = sink if enabled else None
        self._handle: TextIO | None = None
        if enabled and path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = path.open("a", encoding="utf-8")

    def write(self, record: EventRecord) -> None:
        if self._sink is not None:
            self._sink(record)
        if self._handle is None:
            return
        self._handle.write(encode_record(record) + "\n")
        self._handle.flush()

    def emit(self, record_type: type[AnyRecord], **fields: Any) -> None:
        """Build, validate and write one record (nothing on other ranks). A record the contract
        refuses raises :class:`EventRecordError` naming the field."""
        if not self.enabled:
            return
        try:
            record = record_type(**fields)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(
                text if len(text := str(part)) <= 60 else text[:60] + "..." for part in first["loc"]
            )
            kind = record_type.model_fields["type"].default
            raise EventRecordError(
                f"cannot report the run's {kind} record: {where}: {first['msg']} (metric names "
                "are 1-200 characters without control characters, at most 256 in one report; "
                "the model file's compute_metrics names become val_<name>)"
            ) from None
        self.write(record)

    def start(
        self,
        total_steps: int,
        steps_per_epoch: int,
        epochs: int,
        world_size: int,
        resumed_from_step: int,
    ) -> None:
        """The run's plan, before its first step: ``total_steps`` counts from step 0 and is an
        upper bound no step of the run exceeds."""
        self.emit(
            StartRecord,
            total_steps=total_steps,
            steps_per_epoch=steps_per_epoch,
            epochs=epochs,
            world_size=world_size,
            resumed_from_step=resumed_from_step,
        )

    def metrics(self, step: int, epoch: float, values: dict[str, float]) -> None:
        self.emit(MetricsRecord, step=step, epoch=epoch, values=finite_or_none(values))

    def nonfinite_loss(
        self, step: int, reported_at_step: int, epoch: float, metric: str, value: str
    ) -> None:
        """``metric`` became ``value`` (``"nan"``, ``"inf"`` or ``"-inf"``: strings, so the line
        stays strict JSON) at ``step``; the run noticed at ``reported_at_step``."""
        self.emit(
            NonFiniteLossRecord,
            step=step,
            reported_at_step=reported_at_step,
            epoch=epoch,
            metric=metric,
            value=value,
        )

    def instability(
        self,
        step: int,
        epoch: float,
        action: str,
        reason: str,
        loss: float | None,
        grad_norm: float | None,
        lr_scale: float,
        rolled_back_to_step: int | None = None,
    ) -> None:
        """The instability guard found ``step`` unstable and did ``action``."""
        self.emit(
            InstabilityRecord,
            step=step,
            epoch=epoch,
            action=action,
            reason=reason[:500],
            **finite_or_none({"loss": loss, "grad_norm": grad_norm}),
            lr_scale=lr_scale,
            rolled_back_to_step=rolled_back_to_step,
        )

    def preempted(self, step: int, epoch: float, checkpoint: str | None) -> None:
        """SIGTERM stopped the run after ``step``, with the checkpoint file ``checkpoint``."""
        self.emit(PreemptedRecord, step=step, epoch=epoch, checkpoint=checkpoint)

    def eval_samples(self, record: EvalSamplesRecord) -> None:
        """What the model completed for ``eval_prompts`` (built and fitted to the line's bound
        by :func:`ace3.runtime.loop.eval_samples.samples_record`)."""
        if self.enabled:
            self.write(record)

    def rank_failure(self, rank: int, error: BaseException, time_ns: int) -> None:
        """Rank ``rank`` raised ``error`` at ``time_ns`` (``time.time_ns()``)."""
        kind = type(error)
        module = kind.__module__
        name = kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"
        self.emit(
            RankFailureRecord,
            rank=rank,
            error_type=name if _TYPE_NAME.match(name) else "Exception",
            message=plain_text(str(error), MAX_FAILURE_MESSAGE_CHARS),
            time_ns=time_ns,
        )

    def summary(
        self,
        final_metrics: dict[str, Any],
        best_val_accuracy: float | None,
        steps: int,
        epochs: float,
    ) -> None:
        self.emit(
            SummaryRecord,
            final_metrics=finite_or_none(final_metrics),
            best_val_accuracy=best_val_accuracy,
            steps=steps,
            epochs=epochs,
        )

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def report_rank_failure(output_dir: Path, rank: int, error: BaseException, time_ns: int) -> None:
    """Append this rank's ``rank_failure`` record to ``output_dir/events.jsonl``, whatever the
    rank (the record is one short line written at once to a file opened for appending, so
    records of ranks failing together never mix). Best effort: a rank that cannot write it (a
    full disk) still exits with its traceback, and the worker falls back on the ranks' stderr."""
    writer: EventWriter | None = None
    try:
        writer = EventWriter(output_dir / "events.jsonl", enabled=True)
        writer.rank_failure(rank, error, time_ns)
    except (OSError, ValueError):
        pass
    finally:
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close()
