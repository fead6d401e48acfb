"""The shuffle buffer of one reader: samples mixed across the shards it reads.

It holds up to ``size`` samples: each new sample, once the buffer is full, takes the place of a
randomly chosen one, which is given out; at the end of the reader's share the rest are given
out in random order. The random choices come from the reader's own generator
(``numpy.random.default_rng([seed, epoch, reader])``), so the order is a pure function of the
seed, the epoch and the reader. Each sample is kept with its identity ``(shard, index)`` (the
shard's index in the manifest, the sample's index in the shard): a checkpoint stores the
identities and the generator's state, never the samples, and a resumed reader reads the same
samples back (:meth:`ShuffleBuffer.restore`).

With no generator (shuffling off) or a size of at most 1, samples pass straight through.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Identity = tuple[int, int]
Item = tuple[Identity, Any]


class ShuffleBuffer:
    def __init__(self, size: int, rng: np.random.Generator | None) -> None:
        self.rng = rng if size > 1 else None
        self.size = size if self.rng is not None else 0
        self.items: list[Item] = []

    def push(self, identity: Identity, sample: Any) -> Item | None:
        """Take a sample in; give one out (None while the buffer fills)."""
        if self.rng is None:
            return identity, sample
        if len(self.items) < self.size:
            self.items.append((identity, sample))
            return None
        slot = int(self.rng.integers(self.size))
        out = self.items[slot]
        self.items[slot] = (identity, sample)
        return out

    def pop(self) -> Item | None:
        """Give out a remaining sample, chosen at random (None when empty)."""
        if not self.items:
            return None
        assert self.rng is not None
        slot = int(self.rng.integers(len(self.items)))
        self.items[slot], self.items[-1] = self.items[-1], self.items[slot]
        return self.items.pop()

    def identities(self) -> list[list[int]]:
        """The buffered samples' identities, in buffer order."""
        return [[shard, index] for (shard, index), _ in self.items]

    def rng_state(self) -> dict[str, Any] | None:
        return None if self.rng is None else dict(self.rng.bit_generator.state)

    def restore(
        self,
        identities: list[list[int]],
        samples: dict[Identity, Any],
        rng_state: dict[str, Any] | None,
    ) -> None:
        """Put back a saved buffer: its samples (read again by identity) and the generator."""
        if len(identities) > self.size:
            raise ValueError(
                f"the saved shuffle buffer holds {len(identities)} samples, more than "
                f"shuffle_buffer={self.size} allows: resume with the same settings"
            )
        self.items = [((s, i), samples[(s, i)]) for s, i in identities]
        if self.rng is not None and rng_state is not None:
            self.rng.bit_generator.state = rng_state
