"""The engine side of ``ace3.TrainingProfiler``: torch.profiler on rank 0 of a job.

Built from the job's :class:`~ace3.config.specs.ProfilerSpec`. The profiler starts at
``on_train_begin`` and advances one schedule step per optimizer step (``on_batch_end``): it
skips ``wait`` steps, warms up ``warmup`` and records ``active``. When the window closes (or
training ends inside it) it writes ``trace.json`` and ``key_averages.json`` into
``run.resolve_path(spec.output_dir)`` (see :mod:`ace3.runtime.observe.profile_events`). A run that ends
before the window leaves a ``key_averages.json`` with no events whose ``meta.note`` says so,
so the SDK can tell the user instead of failing on a missing file.

A resumed attempt whose directory already holds recorded results does not profile again (the
first attempt's trace stays). When a torch profiler already records this process (in-process
training inside ``with ace3.TrainingProfiler()``), the hook stands aside: two torch profilers
in one process corrupt each other.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ace3.config.specs import ProfilerSpec
from ace3.files import atomic_path
from ace3.runtime.loop.hooks import TrainingHook
from ace3.runtime.observe.profile_events import (
    KEY_AVERAGES_FILE,
    TRACE_FILE,
    write_key_averages,
    write_records,
)
from ace3.training.profiling.torch_profiler import in_process_profiler_running


def torch_activities(names: Sequence[str], device: torch.device) -> tuple[list[Any], list[str]]:
    """The torch activities for ``names`` on ``device``, and the names dropped (``cuda``
    without a CUDA device)."""
    from torch.profiler import ProfilerActivity

    activities: list[Any] = []
    dropped: list[str] = []
    for name in names:
        if name == "cpu":
            activities.append(ProfilerActivity.CPU)
        elif name == "cuda" and device.type == "cuda" and torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        else:
            dropped.append(name)
    if not activities:
        activities.append(ProfilerActivity.CPU)
    return activities, dropped


class ProfilerHook(TrainingHook):
    """torch.profiler over optimizer steps ``wait + warmup + 1 .. wait + warmup + active`` of
    rank 0; a no-op on other ranks."""

    def __init__(self, spec: ProfilerSpec) -> None:
        if not isinstance(spec, ProfilerSpec):
            raise TypeError(
                f"spec must be an ace3.config.specs.ProfilerSpec, got {type(spec).__name__}"
            )
        self.spec = spec
        self.prof: Any = None
        self.steps_seen = 0
        self.written = False
        self.directory: Path | None = None
        self._dropped: list[str] = []

    def _meta(self) -> dict[str, Any]:
        spec = self.spec
        first = spec.wait + spec.warmup + 1
        last = min(spec.wait + spec.warmup + spec.active, self.steps_seen)
        return {
            "rank": self.run.rank,
            "world_size": self.run.world_size,
            "torch_version": torch.__version__,
            "activities": [a for a in spec.activities if a not in self._dropped],
            "dropped_activities": self._dropped,
            "record_shapes": spec.record_shapes,
            "wait": spec.wait,
            "warmup": spec.warmup,
            "active": spec.active,
            "steps_seen": self.steps_seen,
            "recorded_steps": [first, last] if last >= first else None,
        }

    def _already_recorded(self, directory: Path) -> bool:
        path = directory / KEY_AVERAGES_FILE
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(body, dict) and bool(body.get("events"))

    def on_train_begin(self) -> None:
        if not self.run.is_main:
            return
        if in_process_profiler_running() or torch.autograd.profiler._is_profiler_enabled:
            # Two torch profilers in one process silently corrupt each other's results.
            self.run.print(
                "warning: a torch profiler is already recording this process (an "
                "ace3.TrainingProfiler around in-process training?); the job's profiler spec "
                "is skipped and that profiler holds the results"
            )
            return
        self.directory = self.run.resolve_path(self.spec.output_dir)
        if self._already_recorded(self.directory):
            self.run.print(
                f"profiler: {self.directory} already holds a recorded profile (an earlier "
                "attempt); not profiling this attempt"
            )
            self.written = True
            return
        activities, self._dropped = torch_activities(self.spec.activities, self.run.device)
        if self._dropped:
            self.run.print(
                f"warning: profiler activities {self._dropped} dropped: this rank runs on "
                f"{self.run.device} (no CUDA device); profiling the CPU only"
            )
        spec = self.spec
        self.prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=spec.wait, warmup=spec.warmup, active=spec.active, repeat=1
            ),
            on_trace_ready=self._trace_ready,
            record_shapes=spec.record_shapes,
            profile_memory=spec.profile_memory,
            with_stack=spec.with_stack,
            with_flops=spec.with_flops,
        )
        self.prof.start()
        self.run.print(
            f"profiler: recording optimizer steps {spec.wait + spec.warmup + 1}-"
            f"{spec.wait + spec.warmup + spec.active} on rank 0 into {self.directory}"
        )

    def on_batch_end(self, batch: int, logs: dict[str, float]) -> None:
        if self.prof is None:
            return
        self.steps_seen += 1
        self.prof.step()

    def _trace_ready(self, prof: Any) -> None:
        assert self.directory is not None
        self.directory.mkdir(parents=True, exist_ok=True)
        trace = self.directory / TRACE_FILE
        with atomic_path(trace) as tmp:
            prof.export_chrome_trace(os.fspath(tmp))
        write_key_averages(prof, self.directory, self._meta())
        self.written = True
        self.run.print(f"profiler: wrote {trace} and {self.directory / KEY_AVERAGES_FILE}")

    def _finish(self) -> None:
        prof, self.prof = self.prof, None
        if prof is not None:
            prof.stop()  # inside the active window this calls _trace_ready
        if self.directory is not None and not self.written:
            spec = self.spec
            meta = self._meta()
            meta["note"] = (
                f"training ended after {self.steps_seen} optimizer step(s), before the "
                f"profiler's window (steps {spec.wait + spec.warmup + 1}-"
                f"{spec.wait + spec.warmup + spec.active}); lower wait/warmup or train longer"
            )
            write_records(self.directory, meta, None)
            self.written = True
            self.run.print(f"profiler: nothing recorded: {meta['note']}")

    def on_train_end(self, logs: dict[str, float]) -> None:
        self._finish()

    def close(self) -> None:
        self._finish()
