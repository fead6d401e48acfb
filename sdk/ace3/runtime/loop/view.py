"""What the parts of the engine around the training loop may see of it: the loop's contract
with its extensions, the checkpoint saver, the best-checkpoint tracker, the instability guard,
batch-size growth, pruning, quantization, preemption and LoRA merging.

:class:`LoopView` is what they are given (the :class:`ace3.runtime.loop.loop.TrainingLoop`
itself, typed as this Protocol): read-only figures of the run, and named operations that the
loop performs on its own state (report metrics, validate, write a checkpoint now, roll back
to a checkpoint, keep an entry in the next checkpoint's train state). None of them assigns an
attribute of the loop (a unit test checks the engine's sources for it). This module imports
nothing of the loop, so the modules that take a view do not import the loop back.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import nn
from torch.utils.data import Dataset

from ace3.config import TrainingConfig
from ace3.runtime.loop.hooks import HookList
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.observe.reporting import EventWriter
from ace3.runtime.process.distributed import DistContext
from ace3.runtime.user_code import UserCode


@dataclass(frozen=True)
class RunPlace:
    """Where a run writes: ``label`` names it in logs (``job X attempt N`` or ``local run``)."""

    label: str
    output_dir: Path
    checkpoint_dir: Path | None  # None: no checkpoint files (an in-process run without save_dir)
    resumed: bool = False
    keep_checkpoints: int | None = None  # prune checkpoint_dir to the newest N files


class LoopParts(Protocol):
    """What a view shows of the run's components (:class:`ace3.runtime.components.Components`)."""

    @property
    def config(self) -> TrainingConfig: ...
    @property
    def user(self) -> UserCode: ...
    @property
    def model(self) -> nn.Module: ...
    @property
    def train_set(self) -> Dataset[Any]: ...
    @property
    def per_rank_batch(self) -> int: ...
    @property
    def collate_fn(self) -> Any: ...


class LoopView(Protocol):
    """The training loop as its extensions see it (every rank has one; see the module
    docstring). The state is the loop's: read it, change it only through the operations."""

    @property
    def config(self) -> TrainingConfig: ...
    @property
    def ctx(self) -> DistContext: ...
    @property
    def place(self) -> RunPlace: ...
    @property
    def state(self) -> TrainState: ...
    @property
    def parts(self) -> LoopParts: ...
    @property
    def events(self) -> EventWriter: ...
    @property
    def hooks(self) -> HookList: ...
    @property
    def train_data(self) -> Any: ...  # what the training set is read through (data.train_source)
    @property
    def val_loader(self) -> Any: ...  # the validation loader, None without a validation set
    @property
    def batches_per_epoch(self) -> int: ...
    @property
    def micro_batch_split(self) -> int: ...  # each loader batch runs as this many micro-batches
    @property
    def last_step_skipped(self) -> bool: ...  # the loss scaler skipped the last step
    @property
    def last_saved_step(self) -> int | None: ...

    def log(self, message: str) -> None:
        """A line of the run's log (rank 0 writes it)."""

    def done(self) -> bool:
        """The run ends after this step (``max_steps`` reached, or a stop was agreed)."""

    def checkpoint_name(self, step: int) -> str:
        """The file name of the checkpoint of ``step`` in this run's format."""

    def report_metrics(self, values: dict[str, float]) -> None:
        """A metrics event at the current step (every rank calls it)."""

    def evaluate_model(self) -> dict[str, float]:
        """The validation metrics of the model as it is now, not reported ({} without a
        validation set). A collective."""

    def validation_at_step(self) -> dict[str, float]:
        """The validation metrics of the current step: those of the validation that ran at it,
        or from one run (and reported) now. A collective."""

    def saving(self) -> contextlib.AbstractContextManager[Any]:
        """Every extension's ``saving()`` context together (around a checkpoint's write)."""

    def keep_in_checkpoint(self, key: str, value: list[float]) -> None:
        """``value`` travels in the next checkpoints' train state (``carry[key]``)."""

    def save_checkpoint_now(self) -> None:
        """Write the current step's checkpoint unless it is written already (a collective)."""

    def finish_saves(self) -> None:
        """Wait for a background save in flight and record it."""

    def roll_back_to(self, path: Path, lr_scale: float) -> None:
        """Load the checkpoint ``path`` into the run (a collective) and go on from its position
        with the learning rate times ``lr_scale``."""
