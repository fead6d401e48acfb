"""The interface of what the training loop trains on: :class:`TrainData`, the batches of one
data replica epoch by epoch and the position in them a checkpoint keeps. Its kinds are in
:mod:`ace3.runtime.data.train_source` (a map-style dataset, a streamed dataset) and
:mod:`ace3.runtime.data.iterable_source` (a user's ``IterableDataset``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

from ace3.config import TrainingConfig

Collate = Callable[[list[Any]], Any] | None


class TrainData(ABC):
    """The training batches of this rank's data replica."""

    #: (this rank's data replica, how many there are)
    replica: tuple[int, int]
    #: loader batches of one replica in one epoch of the loop
    batches_per_epoch: int
    #: the loop's epochs (1 for cycling data: the whole run is one pass)
    epochs: int
    cycling: bool = False

    @abstractmethod
    def describe(self) -> str:
        """What the run trains on, for the log (``1437 training samples``)."""

    @abstractmethod
    def batches(
        self, epoch: int, batch_in_epoch: int, position: Any, collate_fn: Collate
    ) -> Iterator[Any]:
        """The batches of ``epoch`` after its first ``batch_in_epoch``; ``position`` is this
        replica's position from the checkpoint the run resumed from (None otherwise)."""

    def position(self) -> Any:
        """Where this replica stands now, for a checkpoint (None: ``(epoch,
        batch_in_epoch)`` says it all)."""
        return None

    @abstractmethod
    def first_batches(self, collate_fn: Collate) -> Iterator[Any]:
        """Training batches from the start of an epoch, read apart from the run's own (for an
        example batch, quantization's calibration): the run's position is untouched."""


def loader_settings(
    config: TrainingConfig, replica: tuple[int, int], per_rank_batch: int
) -> dict[str, int]:
    """What a saved loader position depends on: a resume must have the same."""
    return {
        "replicas": replica[1],
        "num_workers": config.num_workers,
        "per_rank_batch": per_rank_batch,
    }


def check_loader_settings(position: dict[str, Any], settings: dict[str, int], what: str) -> None:
    """Refuse a loader position saved under other :func:`loader_settings` (``what``: the
    data it is a position in, for the message)."""
    for name, value in settings.items():
        if position.get(name) != value:
            raise ValueError(
                f"the checkpoint's position in {what} was saved with {name}="
                f"{position.get(name)} and this run has {name}={value}: resume it with the "
                "same num_workers, batch_size and data-parallel processes"
            )
