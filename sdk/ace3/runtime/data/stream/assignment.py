"""Which shards each reader reads, epoch by epoch, and which shards validation holds out.

The readers of one split are numbered ``reader = rank * W + worker`` of ``R * W`` (W DataLoader
workers per rank, at least 1). Each epoch the shards are put in an order (a permutation from
``numpy.random.default_rng([seed, epoch])``, or the manifest's order without shuffling) and
dealt largest first (by samples when every shard's count is known, else by bytes; equal loads
in that order), each to the reader with the least load so far (ties to the lowest reader); a
reader reads its shards in the epoch's order. So the readers' shards are disjoint and
balanced (within one shard of each other, closer for shards of equal sizes), and the same
(seed, epoch) gives every rank the same assignment without talking to the others.

A reader left without a shard (more readers than shards) reads the share of a reader that has
some (reader ``k`` of the empty ones takes the share of non-empty reader ``k mod n``): its
samples repeat another reader's, as a DistributedSampler pads, but no rank waits for data
that never comes. Validation readers are not filled so (each sample counts once): one
without a shard reads nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from ace3.config import TrainingConfig
from ace3.runtime.job_spec import DatasetSpec

DEFAULT_VALIDATION_SHARDS = 0.1
_CACHED_EPOCHS = 4


def shard_order(count: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The order shards (positions ``0..count-1``) are dealt in this epoch."""
    if not shuffle:
        return list(range(count))
    return [int(i) for i in np.random.default_rng([seed, epoch]).permutation(count)]


def assign(
    order: Sequence[int], loads: Sequence[int], readers: int, fill_empty: bool = True
) -> list[list[int]]:
    """Deal the shards of ``order``, largest load first (equal loads in ``order``), each to the
    least loaded reader (ties: the lowest); each share is read in ``order``. A reader left
    empty takes a copy of a non-empty reader's share (unless ``fill_empty`` is False:
    validation counts each sample once)."""
    if readers < 1:
        raise ValueError(f"readers must be at least 1, not {readers}")
    heap = [(0, reader) for reader in range(readers)]
    shares: list[list[int]] = [[] for _ in range(readers)]
    for shard in sorted(order, key=lambda s: -loads[s]):  # stable: ties keep the epoch's order
        load, reader = heapq.heappop(heap)
        shares[reader].append(shard)
        heapq.heappush(heap, (load + loads[shard], reader))
    place = {shard: position for position, shard in enumerate(order)}
    shares = [sorted(share, key=place.__getitem__) for share in shares]
    full = [share for share in shares if share]
    if full and fill_empty:
        empty = [reader for reader, share in enumerate(shares) if not share]
        for k, reader in enumerate(empty):
            shares[reader] = list(full[k % len(full)])
    return shares


class ShardPlan:
    """The shares of one split's shards among its readers, per epoch.

    ``counts[i]`` is shard ``i``'s sample count (None when unknown), ``sizes[i]`` its bytes."""

    def __init__(
        self,
        counts: Sequence[int | None],
        sizes: Sequence[int],
        readers: int,
        seed: int,
        shuffle: bool,
        fill_empty: bool = True,
    ) -> None:
        if not counts:
            raise ValueError("a stream needs at least one shard")
        self.readers = readers
        self.seed = seed
        self.shuffle = shuffle
        self.counts: list[int] | None = (
            None if any(c is None for c in counts) else [int(c or 0) for c in counts]
        )
        self._loads = list(self.counts) if self.counts is not None else list(sizes)
        self.fill_empty = fill_empty
        self._cache: dict[int, list[list[int]]] = {}

    def shares(self, epoch: int) -> list[list[int]]:
        """Every reader's shards (positions in the split's file list) in reading order."""
        key = epoch if self.shuffle else 0
        if key not in self._cache:
            if len(self._cache) >= _CACHED_EPOCHS:
                self._cache.pop(next(iter(self._cache)))
            order = shard_order(len(self._loads), self.seed, key, self.shuffle)
            self._cache[key] = assign(order, self._loads, self.readers, self.fill_empty)
        return self._cache[key]

    def share(self, epoch: int, reader: int) -> list[int]:
        return self.shares(epoch)[reader]

    def samples_per_reader(self, epoch: int) -> list[int] | None:
        """Each reader's samples in ``epoch`` (before any wrap), when every count is known."""
        counts = self.counts
        if counts is None:
            return None
        return [sum(counts[shard] for shard in share) for share in self.shares(epoch)]

    def longest(self, epochs: int) -> int | None:
        """The most samples any reader has in any of the first ``epochs`` epochs: the length
        every reader's epoch is wrapped to, so each rank runs the same number of batches every
        epoch. None when a count is unknown."""
        if self.counts is None:
            return None
        return max(
            max(self.samples_per_reader(epoch) or [0])
            for epoch in range(max(1, epochs) if self.shuffle else 1)
        )


def split_shards(spec: DatasetSpec, config: TrainingConfig) -> tuple[list[str], list[str]]:
    """(train files, validation files) of a stream with no validation dataset of its own.

    ``validation_split`` None holds out 10% of the shards (at least one; none when there is
    only one shard), a fraction ``f`` holds out ``max(1, round(f * n))`` (always leaving one to
    train on), 0 none; the held-out shards are chosen by ``numpy.random.default_rng([seed])``.
    Both lists keep the manifest's order."""
    if spec.stream is None:
        raise ValueError(f"{spec.path}: not a streamed dataset")
    files = [shard.file for shard in spec.stream.shards]
    count = len(files)
    fraction = config.validation_split
    if fraction == 0 or (fraction is None and count == 1):
        return files, []
    if count == 1:
        raise ValueError(
            f"validation_split: the dataset has one shard, so no whole shard can be held out "
            f"for validation ({fraction}); set validation_split=0 or give a validation dataset"
        )
    share = DEFAULT_VALIDATION_SHARDS if fraction is None else fraction
    held = min(count - 1, max(1, round(share * count)))
    chosen = set(np.random.default_rng([config.seed]).choice(count, size=held, replace=False))
    train = [name for i, name in enumerate(files) if i not in chosen]
    validation = [name for i, name in enumerate(files) if i in chosen]
    return train, validation
