"""What the training loop trains on (:class:`ace3.runtime.data.train_data.TrainData`): the
batches of one data replica, epoch by epoch, and the position in them a checkpoint keeps.

Three kinds (:func:`train_data_for` picks one from the training set):

- :class:`IndexedTrainData`, a map-style dataset (a data file, a ``dataset.py``, an in-process
  run's dataset): a ``DistributedSampler`` shuffled by ``seed`` and the epoch, read by a
  ``DataLoader`` that skips the micro-batches a resumed run already consumed
  (:mod:`ace3.runtime.data.loaders`). Its order is a pure function of (seed, epoch), so the
  position is the loop's ``(epoch, batch_in_epoch)`` alone: a checkpoint needs nothing more.
- :class:`StreamTrainData`, a streamed (sharded) dataset (:mod:`ace3.runtime.data.stream`):
  torchdata's ``StatefulDataLoader`` over this replica's ``ShardStream`` (``batch_size`` the
  per-rank batch, ``num_workers`` DataLoader workers, each a reader of its own shards). Its
  position is the loader's ``state_dict()`` (every worker's reader: shard cursor, shuffle
  buffer, RNG), which every checkpoint keeps per data replica (``data_per_replica``,
  :mod:`ace3.runtime.checkpoint.plain`) and a resume loads before the first batch, so a resumed
  job reads exactly the samples it had not read.
- :class:`ace3.runtime.data.iterable_source.IterableTrainData`, any other ``IterableDataset``
  (a ``dataset.py``'s): it cycles as a stream of unknown length does (below), re-iterated with
  ``set_epoch`` at each end; see its module.

Epochs of a stream: with every shard's sample count known, an epoch is the stream's
``batches_per_epoch`` (the same on every rank) and the run plans ``epochs`` of them (3 when
unset). With ``epochs`` unset and ``max_steps`` set, or with an unknown sample count (jsonl,
webdataset: then ``max_steps`` is required and ``epochs`` refused), the stream cycles: each
reader goes on to its share of the next pass by itself, and the loop runs the whole job as ONE
epoch of ``max_steps`` optimizer steps (``max_steps * gradient_accumulation_steps`` loader
batches). Its events then report epoch 1 throughout (the one pass the run is), the ``start``
record ``epochs=1`` and ``steps_per_epoch = total_steps = max_steps``; validation runs at its end
(and wherever a checkpoint measures it).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ace3.config import TrainingConfig
from ace3.config.batch_growth import batch_growth
from ace3.runtime.data.datasets import refuse_uncounted_epochs
from ace3.runtime.data.iterable_source import IterableTrainData
from ace3.runtime.data.loaders import batches_per_epoch, train_loader, train_sampler
from ace3.runtime.data.train_data import (
    Collate,
    TrainData,
    check_loader_settings,
    loader_settings,
)
from ace3.runtime.loop.losses import move_to_device
from ace3.runtime.loop.rng import rank_seed


class IndexedTrainData(TrainData):
    """A map-style dataset through a ``DistributedSampler`` (see the module docstring)."""

    def __init__(
        self,
        dataset: Dataset[Any],
        config: TrainingConfig,
        replica: tuple[int, int],
        per_rank_batch: int,
        rank: int,
        pin_memory: bool,
    ) -> None:
        self.dataset, self.config, self.replica = dataset, config, replica
        self.per_rank_batch, self.rank, self.pin_memory = per_rank_batch, rank, pin_memory
        self.sampler = train_sampler(dataset, *replica, config.seed, config.shuffle)
        self.batches_per_epoch = batches_per_epoch(self.sampler, per_rank_batch)
        self.epochs = config.epoch_count

    def describe(self) -> str:
        return f"{len(self.sampler.dataset)} training samples"

    def batches(
        self, epoch: int, batch_in_epoch: int, position: Any, collate_fn: Collate
    ) -> Iterator[Any]:
        # The loader's generator is a pure function of (seed + epoch, rank): never the global RNG.
        self.sampler.set_epoch(epoch)
        config = self.config
        loader = train_loader(
            self.dataset, self.sampler, self.per_rank_batch, batch_in_epoch, config.num_workers,
            rank_seed(config.seed + epoch, self.rank), pin_memory=self.pin_memory,
            collate_fn=collate_fn,
        )  # fmt: skip
        return iter(loader)

    def first_batches(self, collate_fn: Collate) -> Iterator[Any]:
        loader = train_loader(
            self.dataset, self.sampler, self.per_rank_batch, 0, 0, self.config.seed,
            pin_memory=False, collate_fn=collate_fn,
        )  # fmt: skip
        return iter(loader)


class StreamTrainData(TrainData):
    """A streamed dataset through a ``StatefulDataLoader`` (see the module docstring).
    ``stream`` is this replica's ``ShardStream`` of the training split."""

    def __init__(
        self,
        stream: IterableDataset[Any],
        config: TrainingConfig,
        replica: tuple[int, int],
        per_rank_batch: int,
        rank: int,
        pin_memory: bool,
    ) -> None:
        from ace3.runtime.data.stream import stream_collate

        self.stream, self.config, self.replica = stream, config, replica
        self.per_rank_batch, self.rank, self.pin_memory = per_rank_batch, rank, pin_memory
        # (a stream's own: text records are padded by collate_text)
        self.collate: Callable[[list[Any]], Any] = getattr(stream, "collate_fn", stream_collate)
        self.template = copy.deepcopy(stream)  # unread: first_batches' copies start from it
        if batch_growth(config) is not None:
            raise ValueError(
                "dynamic_batch_size: batch-size growth is not supported on a streamed (sharded) "
                "dataset (its position counts batches of one size): set dynamic_batch_size=True"
            )
        per_epoch = stream.batches_per_epoch(per_rank_batch)
        self.cycling = per_epoch is None
        if per_epoch is None:
            refuse_uncounted_epochs(config)  # (a stream told to cycle passes)
            assert config.max_steps is not None
            per_epoch, self.epochs = config.max_steps * config.gradient_accumulation_steps, 1
        else:
            self.epochs = config.epoch_count
        self.batches_per_epoch = per_epoch
        self._loader: Any = None  # the current epoch's StatefulDataLoader
        self._epoch, self._taken = 0, 0  # its epoch, and the batches the loop took of it

    def describe(self) -> str:
        shards = len(getattr(self.stream, "files", []) or [])
        kind = f"a streamed dataset of {shards} training shard(s)"
        if self.cycling:
            return f"{kind}, cycling (the run is one pass of max_steps={self.config.max_steps})"
        return kind

    def _settings(self) -> dict[str, int]:
        return loader_settings(self.config, self.replica, self.per_rank_batch)

    def batches(
        self, epoch: int, batch_in_epoch: int, position: Any, collate_fn: Collate
    ) -> Iterator[Any]:
        from torchdata.stateful_dataloader import StatefulDataLoader  # type: ignore[import-untyped]  # torchdata ships no types

        if batch_in_epoch >= self.batches_per_epoch:
            self._loader = None
            return iter(())  # (a checkpoint at the epoch's end: nothing left of it)
        self.stream.set_epoch(epoch)
        with warnings.catch_warnings():  # (torchdata 0.11 calls a deprecated torch function)
            warnings.filterwarnings("ignore", message=".*set_vital.*deprecated")
            loader = StatefulDataLoader(
                self.stream,
                batch_size=self.per_rank_batch,
                num_workers=self.config.num_workers,
                collate_fn=self.collate,
                pin_memory=self.pin_memory,
                drop_last=False,
                # (never the global RNG: only the workers' seeds come from it)
                generator=torch.Generator().manual_seed(
                    rank_seed(self.config.seed + epoch, self.rank)
                ),
            )
        if batch_in_epoch > 0:
            loader.load_state_dict(self._checked(position, epoch, batch_in_epoch))
        self._loader, self._epoch, self._taken = loader, epoch, batch_in_epoch
        return self._counted(iter(loader))

    def _checked(self, position: Any, epoch: int, batch_in_epoch: int) -> Any:
        """The loader state of ``position``, which must be this run's place and settings."""
        if not isinstance(position, dict) or "loader" not in position:
            raise ValueError(
                f"resuming epoch {epoch + 1} after {batch_in_epoch} batch(es) of a streamed "
                "dataset needs its data position, and the checkpoint holds none (was it "
                "written by a job of another dataset?)"
            )
        check_loader_settings(position, self._settings(), "the streamed dataset")
        if (position.get("epoch"), position.get("batch_in_epoch")) != (epoch, batch_in_epoch):
            raise ValueError(
                "the checkpoint's position in the streamed dataset (epoch "
                f"{position.get('epoch')}, batch {position.get('batch_in_epoch')}) is not its "
                f"training position (epoch {epoch}, batch {batch_in_epoch})"
            )
        return position["loader"]

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            self._taken += 1
            yield batch
        if self._taken < self.batches_per_epoch:  # (the loop takes no more than the epoch's)
            raise RuntimeError(
                f"the streamed dataset ended after {self._taken} batch(es) of epoch "
                f"{self._epoch + 1}, which has {self.batches_per_epoch} on every rank"
            )

    def position(self) -> Any:
        if self._loader is None:
            return None
        return {
            **self._settings(),
            "epoch": self._epoch,
            "batch_in_epoch": self._taken,
            "loader": self._loader.state_dict(),
        }

    def first_batches(self, collate_fn: Collate) -> Iterator[Any]:
        stream = copy.deepcopy(self.template)
        stream.set_epoch(0)
        loader = DataLoader(
            stream,
            batch_size=self.per_rank_batch,
            num_workers=0,
            collate_fn=self.collate,
            generator=torch.Generator().manual_seed(0),
        )
        return iter(loader)


def train_data_for(
    dataset: Dataset[Any],
    config: TrainingConfig,
    replica: tuple[int, int],
    per_rank_batch: int,
    rank: int,
    pin_memory: bool,
) -> TrainData:
    """The training data of this rank (``rank``: its global rank, for seeds) in its data
    replica ``replica`` (index, count)."""
    if not isinstance(dataset, IterableDataset):
        return IndexedTrainData(dataset, config, replica, per_rank_batch, rank, pin_memory)
    from ace3.runtime.data.stream import ShardStream

    if isinstance(dataset, ShardStream):
        return StreamTrainData(dataset, config, replica, per_rank_batch, rank, pin_memory)
    return IterableTrainData(dataset, config, replica, per_rank_batch, rank, pin_memory)


def example_batch(data: TrainData, collate_fn: Collate, device: torch.device) -> Any:
    """The first training batch on ``device`` (for hooks' graphs and images); None if
    unavailable."""
    try:
        return move_to_device(next(data.first_batches(collate_fn)), device)
    except Exception:
        return None
