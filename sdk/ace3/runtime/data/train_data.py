"""The interface of what the training loop trains on: :class:`TrainData`, the batches of one
data replica epoch by epoch and the position in them a checkpoint keeps. Its kinds are in
:mod:`ace3.runtime.data.train_source` (a map-style dataset, a streamed dataset) and
:mod:`ace3.runtime.data.iterable_source` (a user's ``IterableDataset``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

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
