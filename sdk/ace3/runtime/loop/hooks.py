"""Hooks: how callbacks, loggers and profilers see a training run inside the engine.

The training loop (:mod:`ace3.runtime.loop.loop`) calls every hook of a :class:`HookList` at
the same points on every rank, in this order::

    bind(run) -> on_train_begin()
      per epoch:  on_epoch_begin(epoch)
                    per optimizer step: on_batch_begin(batch) ... on_batch_end(batch, logs)
                  on_epoch_end(epoch, logs)
      on_metrics(step, epoch, values) for every metrics event (rank 0's values, on all ranks)
      on_checkpoint(step, path) after each checkpoint is written (path only on rank 0)
    on_train_end(logs)

``epoch`` counts from 1 (as in the job's events); ``batch`` is the 0-based optimizer step
within the epoch. Batch ``logs``: ``loss`` (this rank's mean loss of the step), ``step``
(global optimizer steps done), ``learning_rate``, ``batch_size`` (samples on this rank).
Epoch ``logs``: the epoch's metrics (``epoch_train_loss``, ``val_loss``, ``val_accuracy``, ...)
plus ``train_loss`` (= ``epoch_train_loss``), identical on every rank.

A hook asks to stop by returning True from :meth:`TrainingHook.wants_stop`; the loop agrees
across ranks (any rank asking stops all) at each epoch end, and after each batch when some hook
has ``checks_stop_every_batch``. Hooks that print should do so on rank 0 only
(``run.is_main``), or use :meth:`RunContext.print`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ace3.config.specs import ARTIFACT_SCHEME
from ace3.runtime.observe.log import ENGINE


@dataclass
class RunContext:
    """What a hook may use: the live objects of this rank and where to write files."""

    model: nn.Module  # the plain module (unwrapped from DDP); model.stop_training is honoured
    optimizer: torch.optim.Optimizer
    config: Any  # ace3.config.TrainingConfig
    rank: int
    world_size: int
    device: torch.device
    output_dir: Path  # the job's output directory; artifacts live under output_dir/artifacts
    scheduler: Any = None  # the learning-rate scheduler, when one is configured
    # Saves the full training state ("checkpoint") or the weights alone to a path (rank 0 only;
    # every rank must call it at the same point: it may run collectives).
    save_model: Callable[[Path, bool], None] | None = None
    example_batch: Any = None  # one training batch on the device (for graphs and images)
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def print(self, *args: Any) -> None:
        """A line of the engine's log (rank 0), as ``print(*args)`` would write it."""
        if self.is_main:
            ENGINE.info(" ".join(str(arg) for arg in args))

    def resolve_path(self, path: str) -> Path:
        """``artifact://x/y`` -> ``output_dir/artifacts/x/y``; any other path as given."""
        if path.startswith(ARTIFACT_SCHEME):
            return self.output_dir / "artifacts" / path[len(ARTIFACT_SCHEME) :]
        return Path(path)


class TrainingHook:
    """Base class: every method is a no-op. See the module docstring for when each runs."""

    #: the loop agrees on wants_stop() after every batch (one tiny all-reduce per step)
    checks_stop_every_batch: bool = False
    #: on_batch_end needs logs (costs a device sync per step for the loss value)
    wants_batch_logs: bool = False

    def bind(self, run: RunContext) -> None:
        self.run = run

    def on_train_begin(self) -> None: ...

    def on_epoch_begin(self, epoch: int) -> None: ...

    def on_batch_begin(self, batch: int) -> None: ...

    def on_batch_end(self, batch: int, logs: dict[str, float]) -> None: ...

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None: ...

    def on_metrics(self, step: int, epoch: int, values: dict[str, float]) -> None: ...

    def on_checkpoint(self, step: int, path: Path | None) -> None: ...

    def on_train_end(self, logs: dict[str, float]) -> None: ...

    def wants_stop(self) -> bool:
        return False

    def close(self) -> None:
        """Release files and threads; called once at the end, also after a failure."""


class HookList(TrainingHook):
    """Calls each hook in order."""

    def __init__(self, hooks: Iterable[TrainingHook] = ()) -> None:
        self.hooks = list(hooks)
        self.checks_stop_every_batch = any(h.checks_stop_every_batch for h in self.hooks)
        self.wants_batch_logs = any(h.wants_batch_logs for h in self.hooks)

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def bind(self, run: RunContext) -> None:
        self.run = run
        for hook in self.hooks:
            hook.bind(run)

    def on_train_begin(self) -> None:
        for hook in self.hooks:
            hook.on_train_begin()

    def on_epoch_begin(self, epoch: int) -> None:
        for hook in self.hooks:
            hook.on_epoch_begin(epoch)

    def on_batch_begin(self, batch: int) -> None:
        for hook in self.hooks:
            hook.on_batch_begin(batch)

    def on_batch_end(self, batch: int, logs: dict[str, float]) -> None:
        for hook in self.hooks:
            hook.on_batch_end(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        for hook in self.hooks:
            hook.on_epoch_end(epoch, logs)

    def on_metrics(self, step: int, epoch: int, values: dict[str, float]) -> None:
        for hook in self.hooks:
            hook.on_metrics(step, epoch, values)

    def on_checkpoint(self, step: int, path: Path | None) -> None:
        for hook in self.hooks:
            hook.on_checkpoint(step, path)

    def on_train_end(self, logs: dict[str, float]) -> None:
        for hook in self.hooks:
            hook.on_train_end(logs)

    def wants_stop(self) -> bool:
        return any(hook.wants_stop() for hook in self.hooks)

    def close(self) -> None:
        for hook in self.hooks:
            try:
                hook.close()
            except Exception as exc:  # one failing close must not hide the others
                ENGINE.warning(f"warning: closing {type(hook).__name__} failed: {exc}")
