"""Every checkpoint the training loop writes: best-by-metric tracking, synchronous or
asynchronous writing, the checkpoint record, pruning.

:meth:`CheckpointSaver.save` (every rank, at the same step):

The file is ``step-XXXXXXXX.pt`` (the plain format: :mod:`ace3.runtime.checkpoint.plain`, or
gathered from a split model: :mod:`ace3.runtime.checkpoint.gathered`) or, for ZeRO jobs,
``step-XXXXXXXX.dcp.tar`` (every rank writes its shards, rank 0 packs them:
:mod:`ace3.runtime.checkpoint.sharded`); the record is the same.

1. waits for the previous background save, if one is in flight (at most one at a time);
2. with ``keep_best_checkpoint``, measures the monitored metric at this step
   (:class:`ace3.runtime.checkpoint.best.BestCheckpoint`; may run the validation set);
3. gathers the RNG states (and data positions) and lets the strategy's format (``strategy.checkpoints``:
   :mod:`ace3.runtime.checkpoint.format`) write the file inside the extensions'
   ``saving()`` contexts; with ``async_save`` the format only stages the state in CPU memory
   and hands the write to :class:`ace3.runtime.checkpoint.background.BackgroundWriter`;
4. once the file is complete -- at once for a synchronous save; for a background one when
   :meth:`poll` (after every step) or the next :meth:`save` / :meth:`close` finds it done --
   rank 0 appends the ``checkpoint`` record (sha256, size, metrics as of the save's step, the
   monitored value, whether it is the best so far), prunes the directory to the newest
   ``keep_checkpoints`` files plus the best one, and the hooks' ``on_checkpoint`` runs.

So the worker, which reads the record and then verifies and copies the file, never sees a
record before its file is whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ace3.config.events import CheckpointRecord, finite_or_none
from ace3.runtime.checkpoint.background import BackgroundWriter
from ace3.runtime.checkpoint.best import CARRY_KEY, BestCheckpoint, refuse_unmeasurable_monitor
from ace3.runtime.checkpoint.files import SavedCheckpoint
from ace3.runtime.checkpoint.plain import gather_rank_states
from ace3.runtime.process.distributed import barrier

if TYPE_CHECKING:
    from ace3.runtime.components import Components
    from ace3.runtime.loop.view import LoopView


@dataclass(frozen=True)
class _Pending:
    """What the record of a checkpoint says, captured when its state was staged."""

    step: int
    epoch: int
    name: str
    metrics: dict[str, float | None]
    monitor_value: float | None
    best: bool


class CheckpointSaver:
    """Writes the loop's checkpoints (see the module docstring). ``directory`` None: no files
    (an in-process run without ``save_dir``). It sees the loop through its view and writes
    the state of ``parts``."""

    def __init__(
        self, loop: LoopView, parts: Components, directory: Path | None, keep: int | None
    ) -> None:
        self.loop, self.parts, self.directory, self.keep = loop, parts, directory, keep
        config = loop.config
        self.background = BackgroundWriter() if config.async_save else None
        self.best: BestCheckpoint | None = None
        if config.keep_best_checkpoint:
            refuse_unmeasurable_monitor(config, loop.val_loader is not None)
            self.best = BestCheckpoint(
                config.checkpoint_monitor, config.checkpoint_mode, loop.state.carry
            )
        self._pending: _Pending | None = None

    @property
    def best_name(self) -> str | None:
        if self.best is None or self.best.step is None:
            return None
        return self.loop.checkpoint_name(self.best.step)

    def save(self) -> None:
        """Write (or stage and start writing) the checkpoint of the current step."""
        if self.directory is None:
            return
        loop = self.loop
        self._finish()  # at most one save in flight
        value = self.best.measure(loop) if self.best is not None else None
        state, checkpoints = loop.state, self.parts.strategy.checkpoints
        best = self.best is not None and self.best.update(state.step, value)
        if self.best is not None and (carried := self.best.carry()) is not None:
            loop.keep_in_checkpoint(CARRY_KEY, carried)  # this one included: a run resumed from it
        name = checkpoints.name(state.step)
        with loop.saving():
            ranks = gather_rank_states(loop.ctx, self.parts)
            saved = checkpoints.save(self.parts, self.directory / name, ranks, self.background)
        self._pending = _Pending(
            step=state.step,
            epoch=state.display_epoch(),
            name=name,
            metrics=finite_or_none(dict(state.last_metrics)),
            # (a NaN or infinite value is no measure: the record says None, the best stays)
            monitor_value=value if value is not None and math.isfinite(value) else None,
            best=best,
        )
        if self.background is None:
            self._record(saved)
            barrier(loop.ctx)
        elif not self.background.busy:  # this rank had nothing to write (DDP: not rank 0)
            self._record(None)

    def poll(self) -> None:
        """After a step: record a background save that has finished (no collective)."""
        if self.background is not None and self.background.busy and self.background.done():
            self._finish()

    def close(self, failed: bool = False) -> None:
        """At the end of the run (also on failure): wait for the save in flight and record it.
        After a failure, an error of the background write is printed, not raised (the first
        error stays the run's)."""
        try:
            self._finish()
        except Exception as exc:
            if not failed:
                raise
            self.loop.log(f"error: {exc}")

    def _finish(self) -> None:
        if self.background is not None and self.background.busy:
            self._record(self.background.wait())

    def _record(self, saved: SavedCheckpoint | None) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        loop = self.loop
        best = pending.best
        if saved is not None:  # rank 0
            extra: dict[str, Any] = {}
            if self.best is not None:
                extra = {
                    "monitor": self.best.monitor,
                    "monitor_value": pending.monitor_value,
                    "best": best,
                }
            loop.events.emit(
                CheckpointRecord,
                step=pending.step,
                epoch=pending.epoch,
                name=saved.path.name,
                path=str(saved.path),
                sha256=saved.sha256,
                size_bytes=saved.size_bytes,
                metrics=pending.metrics,
                **extra,
            )
            shown = ""
            if best and self.best is not None:
                shown = f", best {self.best.monitor}={pending.monitor_value:.5g}"
            loop.log(
                f"checkpoint {saved.path.name} saved "
                f"({saved.size_bytes} bytes, sha256 {saved.sha256[:12]}{shown})"
            )
            if self.keep and self.directory is not None:
                protect = frozenset(name for name in (self.best_name,) if name)
                self.parts.strategy.checkpoints.prune(self.directory, self.keep, protect)
        loop.hooks.on_checkpoint(pending.step, saved.path if saved is not None else None)
