"""A user's ``IterableDataset`` as the training data (a ``dataset.py`` whose ``build_dataset``
returns one, or an in-process run's ``DataLoader`` over one): :class:`IterableTrainData`.

Splitting: each rank iterates its own copy. ``build_dataset`` got this rank's data replica as
``rank`` and ``world_size`` (:func:`ace3.runtime.data.datasets.call_build_dataset`), and inside
``__iter__`` ``torch.utils.data.get_worker_info()`` says which of the rank's ``num_workers``
loader workers runs it (None: the rank's own process); the dataset gives each (replica, worker)
its own samples. The engine splits nothing: a dataset that does not split trains every replica
on the same samples.

Length: unknown, so it runs as a stream of unknown length does: ``max_steps`` required,
``epochs`` refused, and the loop runs the whole job as ONE epoch of ``max_steps *
gradient_accumulation_steps`` loader batches, the same on every rank. When the dataset's
iteration ends it is iterated again, ``set_epoch(n)`` called first if it has one (n = 0 before
the first iteration, then 1, 2, ...: the dataset's own epochs); an epoch that gives a rank no
batch at all is an error (it would never end). A loader batch is ``per_rank_batch`` samples
collated as a map-style dataset's are (``default_collate``, or an in-process run's
``collate_fn``); each loader worker's last batch of a dataset epoch may be shorter.

Position: a dataset with ``state_dict()`` and ``load_state_dict()`` is read by torchdata's
``StatefulDataLoader``, which takes its state in each loader worker with every batch; every
checkpoint keeps this replica's {dataset epoch, batches taken, loader state}
(``data_per_replica``) and a resume loads it before its first batch, so the resumed run reads
exactly the samples it had not read (if the dataset's state says where it stands: taken after
a sample was yielded, it points past that sample). Without them a resume restarts the dataset
epoch it was in (``set_epoch(n)`` again, from its start): samples of that epoch may repeat, and
rank 0's log says so.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ace3.config import TrainingConfig
from ace3.config.batch_growth import batch_growth
from ace3.runtime.data.datasets import refuse_iterable_epochs
from ace3.runtime.data.train_data import (
    Collate,
    TrainData,
    check_loader_settings,
    loader_settings,
)
from ace3.runtime.loop.rng import rank_seed

#: The engine's log channel (ace3.runtime.observe.log.ENGINE, by name: data/ never imports it).
ENGINE = logging.getLogger("ace3.runtime")


def is_stateful(dataset: Any) -> bool:
    """Whether ``dataset`` keeps its position (torchdata's ``Stateful`` protocol)."""
    return callable(getattr(dataset, "state_dict", None)) and callable(
        getattr(dataset, "load_state_dict", None)
    )


class IterableTrainData(TrainData):
    """A user's ``IterableDataset``, cycling (see the module docstring)."""

    cycling = True

    def __init__(
        self,
        dataset: IterableDataset[Any],
        config: TrainingConfig,
        replica: tuple[int, int],
        per_rank_batch: int,
        rank: int,
        pin_memory: bool,
    ) -> None:
        refuse_iterable_epochs(config)
        if batch_growth(config) is not None:
            raise ValueError(
                "dynamic_batch_size: batch-size growth is not supported on an IterableDataset "
                "(its position counts batches of one size): set dynamic_batch_size=True"
            )
        assert config.max_steps is not None  # (refuse_iterable_epochs)
        self.dataset, self.config, self.replica = dataset, config, replica
        self.per_rank_batch, self.rank, self.pin_memory = per_rank_batch, rank, pin_memory
        self.name = type(dataset).__name__
        self.stateful = is_stateful(dataset)
        self.batches_per_epoch = config.max_steps * config.gradient_accumulation_steps
        self.epochs = 1
        try:  # unread: first_batches' copies start from it
            self.template: IterableDataset[Any] | None = copy.deepcopy(dataset)
        except Exception:
            self.template = None
        self._loader: Any = None  # the current dataset epoch's loader
        self._dataset_epoch, self._in_dataset_epoch, self._taken = 0, 0, 0

    def describe(self) -> str:
        resumes = (
            "it resumes mid-epoch (state_dict)"
            if self.stateful
            else "a resume restarts its epoch (no state_dict)"
        )
        return (
            f"the IterableDataset {self.name}, cycling (the run is one pass of "
            f"max_steps={self.config.max_steps}; {resumes})"
        )

    def _settings(self) -> dict[str, int]:
        return loader_settings(self.config, self.replica, self.per_rank_batch)

    def batches(
        self, epoch: int, batch_in_epoch: int, position: Any, collate_fn: Collate
    ) -> Iterator[Any]:
        if batch_in_epoch >= self.batches_per_epoch:
            self._loader = None
            return iter(())  # (a checkpoint at the run's end: nothing left of it)
        start: tuple[int, int, Any] = (0, 0, None)
        if batch_in_epoch > 0:
            start = self._resume_point(position, batch_in_epoch)
        self._taken = batch_in_epoch
        return self._cycle(*start, collate_fn)

    def _resume_point(self, position: Any, batch_in_epoch: int) -> tuple[int, int, Any]:
        """(dataset epoch, its batches already taken, loader state) to resume from."""
        if not isinstance(position, dict) or "dataset_epoch" not in position:
            if self.stateful:
                raise ValueError(
                    f"resuming after {batch_in_epoch} batch(es) of the IterableDataset "
                    f"{self.name} needs its data position, and the checkpoint holds none (was "
                    "it written by a job of another dataset?)"
                )
            position = {"dataset_epoch": 0}
        if position.get("batch_in_epoch", batch_in_epoch) != batch_in_epoch:
            raise ValueError(
                f"the checkpoint's position in the IterableDataset (batch "
                f"{position.get('batch_in_epoch')}) is not its training position (batch "
                f"{batch_in_epoch})"
            )
        dataset_epoch = int(position["dataset_epoch"])
        if not self.stateful:
            if self.rank == 0:
                ENGINE.info(
                    f"resuming: the IterableDataset {self.name} has no state_dict() / "
                    f"load_state_dict(), so its epoch {dataset_epoch} restarts from its "
                    "beginning: the samples of the interrupted epoch may repeat"
                )
            return dataset_epoch, 0, None
        check_loader_settings(position, self._settings(), "the IterableDataset")
        return dataset_epoch, int(position["batches_in_dataset_epoch"]), position["loader"]

    def _loader_for(self, dataset_epoch: int, collate_fn: Collate) -> Any:
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(dataset_epoch)
        settings: dict[str, Any] = {
            "batch_size": self.per_rank_batch,
            "num_workers": self.config.num_workers,
            "collate_fn": collate_fn,
            "pin_memory": self.pin_memory,
            "drop_last": False,
            # (never the global RNG: only the workers' seeds come from it)
            "generator": torch.Generator().manual_seed(
                rank_seed(self.config.seed + dataset_epoch, self.rank)
            ),
        }
        if not self.stateful:
            return DataLoader(self.dataset, **settings)
        try:
            from torchdata.stateful_dataloader import StatefulDataLoader  # type: ignore[import-untyped]  # torchdata ships no types
        except ImportError as exc:
            raise ImportError(
                f"the IterableDataset {self.name} has state_dict(), which the engine keeps "
                "through torchdata's StatefulDataLoader: install torchdata (the ace3[worker] "
                "or ace3[streaming] extra)"
            ) from exc
        with warnings.catch_warnings():  # (torchdata 0.11 calls a deprecated torch function)
            warnings.filterwarnings("ignore", message=".*set_vital.*deprecated")
            return StatefulDataLoader(self.dataset, **settings)

    def _cycle(
        self, dataset_epoch: int, taken: int, state: Any, collate_fn: Collate
    ) -> Iterator[Any]:
        """The batches from ``taken`` batches into ``dataset_epoch`` (its loader at ``state``),
        then those of the later dataset epochs, up to the run's ``batches_per_epoch``."""
        while self._taken < self.batches_per_epoch:
            loader = self._loader_for(dataset_epoch, collate_fn)
            if state is not None:
                loader.load_state_dict(state)
            resumed = state is not None
            self._loader, self._dataset_epoch, self._in_dataset_epoch = loader, dataset_epoch, taken
            state, taken = None, 0
            for batch in loader:
                self._in_dataset_epoch += 1
                self._taken += 1
                yield batch
                if self._taken >= self.batches_per_epoch:
                    return  # (the run's last batch: the dataset epoch is left where it is)
            if self._in_dataset_epoch == 0 and not resumed:  # (a resumed one may be at its end)
                replica, replicas = self.replica
                raise RuntimeError(
                    f"the IterableDataset {self.name} gave no sample in its epoch "
                    f"{dataset_epoch} on rank {self.rank} (data replica {replica} of "
                    f"{replicas}): every replica needs samples of its own; split by the rank "
                    "and world_size build_dataset gets, and by get_worker_info() (see "
                    "docs/runtime.md)"
                )
            dataset_epoch += 1

    def position(self) -> Any:
        if self._loader is None:
            return None
        return {
            **self._settings(),
            "batch_in_epoch": self._taken,
            "dataset_epoch": self._dataset_epoch,
            "batches_in_dataset_epoch": self._in_dataset_epoch,
            "loader": self._loader.state_dict() if self.stateful else None,
        }

    def first_batches(self, collate_fn: Collate) -> Iterator[Any]:
        if self.template is None:
            raise TypeError(
                f"the IterableDataset {self.name} cannot be copied (copy.deepcopy), so no "
                "batch can be read apart from the run's own"
            )
        dataset = copy.deepcopy(self.template)
        set_epoch = getattr(dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(0)
        loader = DataLoader(
            dataset,
            batch_size=self.per_rank_batch,
            num_workers=0,
            collate_fn=collate_fn,
            generator=torch.Generator().manual_seed(0),
        )
        return iter(loader)
