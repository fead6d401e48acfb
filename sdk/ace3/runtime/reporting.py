"""The rank-0 event log ``output_dir/events.jsonl``: one JSON object a line, appended, flushed.

Records: ``start`` (the run's plan), ``metrics``, ``checkpoint``, ``nonfinite_loss`` (the
training loss became NaN or infinite; the run then stops) and ``summary``; docs/runtime.md
gives their fields. Non-finite floats (a diverged loss) are written as ``null`` so every line
stays valid JSON. On other ranks the writer is a no-op.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class EventWriter:
    """Append-only JSONL writer; enabled on rank 0 only."""

    def __init__(
        self,
        path: Path | None,
        enabled: bool,
        sink: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """``path``: the JSONL file (None: no file); ``sink``: also called with every event
        (an in-process run collects its history this way)."""
        self.path = path
        self._sink = sink if enabled else None
        self._handle: TextIO | None = None
        if enabled and path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = path.open("a", encoding="utf-8")

    def write(self, event: dict[str, Any]) -> None:
        clean = _finite(event)
        if self._sink is not None:
            self._sink(clean)
        if self._handle is None:
            return
        line = json.dumps(clean, allow_nan=False, separators=(",", ":"))
        self._handle.write(line + "\n")
        self._handle.flush()

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
        self.write(
            {
                "type": "start",
                "total_steps": total_steps,
                "steps_per_epoch": steps_per_epoch,
                "epochs": epochs,
                "world_size": world_size,
                "resumed_from_step": resumed_from_step,
            }
        )

    def metrics(self, step: int, epoch: int, values: dict[str, Any]) -> None:
        self.write({"type": "metrics", "step": step, "epoch": epoch, "values": values})

    def nonfinite_loss(
        self, step: int, reported_at_step: int, epoch: int, metric: str, value: str
    ) -> None:
        """``metric`` became ``value`` (``"nan"``, ``"inf"`` or ``"-inf"``: strings, so the line
        stays strict JSON) at ``step``; the run noticed at ``reported_at_step``."""
        self.write(
            {
                "type": "nonfinite_loss",
                "step": step,
                "reported_at_step": reported_at_step,
                "epoch": epoch,
                "metric": metric,
                "value": value,
            }
        )

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
