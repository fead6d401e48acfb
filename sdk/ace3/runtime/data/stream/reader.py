"""One reader's pass over its share of the shards, and the position that resumes it.

A reader (one DataLoader worker of one rank) reads, epoch by epoch, the shards
:class:`~ace3.runtime.data.stream.assignment.ShardPlan` gives it, in order, through its shuffle
buffer. Its :class:`Position` says exactly where it is: the epoch, the shard (``cursor``, an
index into its share that keeps counting when the share wraps around), the samples of that
shard already taken (``offset``), the samples taken and given out this epoch (``fed``,
``yielded``), the buffered samples' identities and the buffer generator's state. Every field
is updated before a sample is given out, so the position read between two samples resumes at
the next one.

When the epoch has a fixed length (``wrap_to``: every shard's count is known and the stream
does not cycle), a reader whose share is shorter reads it again from its start until it has
taken ``wrap_to`` samples, so every reader gives out the same number.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ace3.config.shards import REQUEST_LOOKAHEAD
from ace3.runtime.data.stream.assignment import ShardPlan
from ace3.runtime.data.stream.buffer import Identity, ShuffleBuffer
from ace3.runtime.data.stream.formats import ShardFormat
from ace3.runtime.data.stream.waiting import RequestFile, wait_for_file

STATE_VERSION = 1
LOOKAHEAD = REQUEST_LOOKAHEAD  # shards a request names beyond the one being opened


class Source(Protocol):
    """What a reader reads from (a :class:`~.dataset.ShardStream`)."""

    @property
    def split(self) -> str: ...
    @property
    def directory(self) -> Path: ...
    @property
    def files(self) -> list[str]: ...
    @property
    def sizes(self) -> list[int]: ...
    @property
    def manifest_index(self) -> list[int]: ...
    @property
    def position_of(self) -> dict[int, int]: ...
    @property
    def format(self) -> ShardFormat: ...
    @property
    def plan(self) -> ShardPlan: ...
    @property
    def wrap_to(self) -> int | None: ...
    @property
    def cycle(self) -> bool: ...
    @property
    def shuffle(self) -> bool: ...
    @property
    def seed(self) -> int: ...
    @property
    def buffer_size(self) -> int: ...


@dataclass
class Position:
    epoch: int
    reader: int
    readers: int
    cursor: int = 0
    offset: int = 0
    fed: int = 0
    yielded: int = 0
    finished: bool = False
    buffer: list[list[int]] = field(default_factory=list)
    rng: dict[str, Any] | None = None

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Position:
        names = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in state.items() if k in names})
        except TypeError as exc:
            raise ValueError(f"not a stream reader's state: {exc}") from exc


class Reader:
    """Reads one reader's samples from ``position`` on; :meth:`state` at any point between two
    samples resumes exactly."""

    def __init__(self, stream: Source, position: Position, request: RequestFile) -> None:
        self.stream = stream
        self.position = position
        self.request = request
        self.buffer: ShuffleBuffer | None = None  # this epoch's, once filled back

    def state(self) -> dict[str, Any]:
        p, buffer = self.position, self.buffer
        return {
            "version": STATE_VERSION,
            "epoch": p.epoch,
            "reader": p.reader,
            "readers": p.readers,
            "cursor": p.cursor,
            "offset": p.offset,
            "fed": p.fed,
            "yielded": p.yielded,
            "finished": p.finished,
            "buffer": buffer.identities() if buffer is not None else [list(i) for i in p.buffer],
            "rng": buffer.rng_state() if buffer is not None else p.rng,
        }

    def run(self) -> Iterator[Any]:
        while True:
            yield from self._epoch()
            if not self.stream.cycle:
                break
            p = self.position
            self.position = Position(p.epoch + 1, p.reader, p.readers)
            self.buffer = None
        self.request.write([])

    # -- one epoch ------------------------------------------------------------------------------

    def _epoch(self) -> Iterator[Any]:
        p, stream = self.position, self.stream
        if p.finished:
            return
        share = stream.plan.share(p.epoch, p.reader)
        target = stream.wrap_to
        counts = stream.plan.counts
        fresh = p.fed == 0 and p.cursor == 0 and p.offset == 0
        if (
            target is not None
            and counts is not None
            and p.fed < target
            and not sum(counts[shard] for shard in share)
        ):
            raise ValueError(f"{self._who()}: its shards hold no samples")
        self._fill_buffer(share)
        buffer = self.buffer
        assert buffer is not None
        while not (p.fed >= target if target is not None else p.cursor >= len(share)):
            shard = share[p.cursor % len(share)]
            known = counts[shard] if counts is not None else None
            if known is not None and p.offset >= known:
                p.cursor, p.offset = p.cursor + 1, 0
                continue
            path = self._open(share, shard)
            samples = stream.format.samples(path, p.offset)
            with closing(samples):
                for sample in samples:
                    identity = (stream.manifest_index[shard], p.offset)
                    p.offset += 1
                    p.fed += 1
                    out = buffer.push(identity, sample)
                    if out is not None:
                        p.yielded += 1
                        yield out[1]
                    if target is not None and p.fed >= target:
                        break
                else:
                    if known is not None and p.offset != known:
                        raise ValueError(
                            f"{path}: {p.offset} samples, but the manifest records {known}"
                        )
                    p.cursor, p.offset = p.cursor + 1, 0
                    self.request.write(self._ahead(share, LOOKAHEAD))
        while (out := buffer.pop()) is not None:
            p.yielded += 1
            yield out[1]
        p.finished = True
        if stream.cycle and fresh and p.fed == 0:
            raise ValueError(f"{self._who()}: its shards hold no samples")

    def _fill_buffer(self, share: list[int]) -> None:
        """This epoch's buffer: new, or the saved one read back by its samples' identities."""
        p, stream = self.position, self.stream
        rng = None
        if stream.shuffle and stream.buffer_size > 1:
            rng = np.random.default_rng([stream.seed, p.epoch, p.reader])
        buffer = ShuffleBuffer(stream.buffer_size, rng)
        if p.buffer:
            wanted: dict[int, list[int]] = {}
            for manifest_index, index in p.buffer:
                wanted.setdefault(int(manifest_index), []).append(int(index))
            try:
                shards = [stream.position_of[m] for m in wanted]
            except KeyError as exc:
                raise ValueError(
                    f"the saved shuffle buffer names shard {exc} that is not in this split"
                ) from None
            samples: dict[Identity, Any] = {}
            for shard, (manifest_index, indices) in zip(shards, wanted.items(), strict=True):
                # One buffered shard at a time: a request names at most 1 + LOOKAHEAD shards
                # (the worker fetches no more of it), and the buffer may span more.
                file = stream.files[shard]
                ahead = [f for f in self._ahead(share, LOOKAHEAD + 1) if f != file]
                self.request.write([file, *ahead[:LOOKAHEAD]])
                found = stream.format.take(self._present(shard), indices)
                samples.update({(manifest_index, i): s for i, s in found.items()})
            buffer.restore(p.buffer, samples, p.rng)
        elif p.rng is not None and rng is not None:
            rng.bit_generator.state = p.rng
        self.buffer = buffer
        p.buffer, p.rng = [], None

    # -- shards ---------------------------------------------------------------------------------

    def _open(self, share: list[int], shard: int) -> Path:
        self.request.write(self._ahead(share, LOOKAHEAD + 1))
        return self._present(shard)

    def _present(self, shard: int) -> Path:
        """The shard's file, once the worker has put it there (checked against its size)."""
        stream = self.stream
        path = stream.directory / stream.files[shard]
        wait_for_file(path, self._who())
        size = path.stat().st_size
        if size != stream.sizes[shard]:
            raise ValueError(
                f"{path}: {size} bytes, but the manifest records {stream.sizes[shard]}"
            )
        return path

    def _ahead(self, share: list[int], count: int) -> list[str]:
        """The files of the next ``count`` shards this reader opens, from the current one."""
        p, stream = self.position, self.stream
        counts = stream.plan.counts
        target = stream.wrap_to
        remaining = None if target is None else target - p.fed
        names: list[str] = []
        cursor, offset = p.cursor, p.offset
        for _ in range(2 * len(share) + count):
            if len(names) >= count or (remaining is not None and remaining <= 0):
                break
            if remaining is None and cursor >= len(share):
                if stream.cycle:
                    later = stream.plan.share(p.epoch + 1, p.reader)
                    names += [stream.files[s] for s in later[: count - len(names)]]
                break
            shard = share[cursor % len(share)]
            left = None if counts is None else counts[shard] - offset
            if left is None or left > 0:
                names.append(stream.files[shard])
            if remaining is not None and left is not None:
                remaining -= max(0, left)
            cursor, offset = cursor + 1, 0
        return list(dict.fromkeys(names))

    def _who(self) -> str:
        p = self.position
        return f"{self.stream.split} reader {p.reader} of {p.readers}"
