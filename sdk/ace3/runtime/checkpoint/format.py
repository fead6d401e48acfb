"""What every checkpoint format does for the engine: names, save, load, pruning.

A strategy names its format (:attr:`ace3.runtime.parallel.base.Strategy.checkpoint_format`:
``"plain"``, ``"gathered"`` or ``"sharded"``) and supplies the state it owns
(:class:`ace3.runtime.checkpoint.state_dicts.StateDicts`, or for a split model the whole model
before the split); :func:`ace3.runtime.checkpoint.formats.format_for` makes the format, which
does all the file work: the saver (:mod:`ace3.runtime.checkpoint.saver`), hooks' model files,
resume and the instability guard's roll back all go through it. No strategy reads or writes a
checkpoint file.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ace3.runtime.checkpoint.files import SavedCheckpoint, prune_checkpoint_files

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from ace3.config import TrainingConfig
    from ace3.runtime.checkpoint.background import BackgroundWriter
    from ace3.runtime.data.train_source import TrainData
    from ace3.runtime.loop.precision import Precision
    from ace3.runtime.loop.train_state import TrainState

FormatKind = Literal["plain", "gathered", "sharded"]


@dataclass(frozen=True)
class RankStates:
    """What every rank holds of its own, gathered on rank 0 for a checkpoint: each rank's RNG
    states (``rng_per_rank``), and each data replica's position in a streamed dataset
    (``data_per_replica``; None for an indexed dataset, whose position is the train state's)."""

    rng: list[Any]
    data: list[Any] | None = None

    def payload(self) -> dict[str, Any]:
        """The checkpoint's entries for them."""
        entries: dict[str, Any] = {"rng_per_rank": self.rng}
        if self.data is not None:
            entries["data_per_replica"] = self.data
        return entries


class TrainingParts(Protocol):
    """What a format reads from and loads into the loop's parts
    (:class:`ace3.runtime.components.Components` is one): this rank's module and optimizer,
    the schedule, the position, and what an epoch's length depends on."""

    @property
    def config(self) -> TrainingConfig: ...
    @property
    def model(self) -> nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def precision(self) -> Precision: ...
    @property
    def scaler(self) -> Any: ...
    @property
    def scheduler(self) -> Any: ...
    @property
    def state(self) -> TrainState: ...
    @property
    def train_set(self) -> Dataset[Any]: ...
    @property
    def per_rank_batch(self) -> int: ...
    @property
    def train_data(self) -> TrainData: ...


class CheckpointFormat(ABC):
    """One way of writing and reading a job's checkpoints (every method that writes or loads
    is called by every rank at the same point)."""

    kind: FormatKind

    @abstractmethod
    def name(self, step: int) -> str:
        """The file name of the checkpoint of ``step``."""

    @abstractmethod
    def save(
        self,
        parts: TrainingParts,
        path: Path,
        ranks: RankStates | None,
        background: BackgroundWriter | None = None,
    ) -> SavedCheckpoint | None:
        """Write the training checkpoint at ``path`` (``ranks``: every rank's own states, on
        rank 0: :func:`ace3.runtime.checkpoint.plain.gather_rank_states`); return the file on
        rank 0, None elsewhere. With ``background`` (``async_save``): stage the state in CPU memory, hand
        the write to it and return None (its ``wait()`` gives the file)."""

    @abstractmethod
    def save_model_file(self, parts: TrainingParts, path: Path, weights_only: bool) -> None:
        """For hooks: the full training checkpoint, or the weights alone, at ``path``."""

    @abstractmethod
    def restore(self, ckpt: dict[str, Any], parts: TrainingParts) -> TrainState:
        """Load a checkpoint into ``parts`` (a collective); return the position to go on from."""

    def prune(self, directory: Path, keep: int, protect: frozenset[str]) -> list[Path]:
        """Delete all but the newest ``keep`` checkpoints of ``directory`` (never those named in
        ``protect``); every format's files are ordered by step alike."""
        return prune_checkpoint_files(directory, keep, protect)
