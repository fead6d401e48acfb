"""Data loaders: distributed shuffling for training, exact sharding for validation.

Training uses a ``DistributedSampler`` (shuffled by ``seed`` and the epoch, or in dataset
order with ``shuffle=False``: replica r reads samples r, r + R, r + 2R, ...) and can skip the
micro-batches a resumed run already consumed (:mod:`ace3.runtime.data.train_source` drives them,
and streamed datasets). Validation uses :class:`ShardSampler`, which gives every sample to
exactly one rank (no padding duplicates), so summed metrics are exact; a streamed validation set
is read by this replica's readers, whose shards no other replica reads, and a user's
``IterableDataset`` by this rank's copy, which splits its samples by rank itself.
Loaders get their own ``torch.Generator`` so they never consume the global torch RNG.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler
from torch.utils.data.distributed import DistributedSampler


class SkipSampler(Sampler[int]):
    """Yields the indices of ``sampler`` after the first ``skip``."""

    def __init__(self, sampler: Sampler[int], skip: int) -> None:
        self.sampler = sampler
        self.skip = skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        assert isinstance(self.sampler, Sized)
        return max(0, len(self.sampler) - self.skip)


class ShardSampler(Sampler[int]):
    """Indices ``rank, rank + world, ...`` in order: every sample on exactly one rank."""

    def __init__(self, length: int, rank: int, world_size: int) -> None:
        self.length, self.rank, self.world_size = length, rank, world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.world_size))


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def train_sampler(
    dataset: Dataset[Any], rank: int, world_size: int, seed: int, shuffle: bool = True
) -> DistributedSampler[Any]:
    """Replica ``rank`` of ``world_size``: shuffled by ``seed`` and the epoch, or (``shuffle``
    False, ``TrainingConfig.shuffle``) samples ``rank, rank + world_size, ...`` in dataset
    order every epoch; the dataset is padded with its first samples to a multiple of
    ``world_size``. Its length does not depend on ``shuffle``."""
    return DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=False
    )


def train_loader(
    dataset: Dataset[Any],
    sampler: DistributedSampler[Any],
    batch_size: int,
    skip_batches: int,
    num_workers: int,
    seed: int,
    pin_memory: bool,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> DataLoader[Any]:
    """Loader over ``sampler``'s current epoch, starting after ``skip_batches`` batches."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=SkipSampler(sampler, skip_batches * batch_size),
        num_workers=num_workers,
        pin_memory=pin_memory,
        drop_last=False,
        generator=_generator(seed),
        collate_fn=collate_fn,
    )


def batches_per_epoch(sampler: DistributedSampler[Any], batch_size: int) -> int:
    return -(-len(sampler) // batch_size)


def validation_loader(
    dataset: Dataset[Any],
    rank: int,
    world_size: int,
    batch_size: int,
    num_workers: int,
    pin_memory: bool,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> DataLoader[Any]:
    """Every sample on exactly one rank: ``ShardSampler``'s indices, or a streamed dataset's
    readers of this replica (disjoint shards, one pass), or one pass over a user's
    ``IterableDataset`` (this rank's copy, which splits its samples itself)."""
    if isinstance(dataset, IterableDataset):
        from ace3.runtime.data.stream import ShardStream

        return DataLoader(
            dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            drop_last=False,
            generator=_generator(0),
            collate_fn=dataset.collate_fn if isinstance(dataset, ShardStream) else collate_fn,
        )
    assert isinstance(dataset, Sized)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=ShardSampler(len(dataset), rank, world_size),
        num_workers=num_workers,
        pin_memory=pin_memory,
        drop_last=False,
        generator=_generator(0),
        collate_fn=collate_fn,
    )
