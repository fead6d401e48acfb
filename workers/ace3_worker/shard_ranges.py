"""Reading a shard's bytes fast, and cheaply in CPU: on a machine of few cores the object store
may share them (``benchmarks/data_streaming.py``: SeaweedFS on the same two cores), so every
CPU-second the fetch spends is one the store cannot serve with.

A shard of a bucket of at least :data:`RANGED_MIN_BYTES` is read as parts of at most
:data:`PART_BYTES` (GETs of a byte range, each checked against the manifest by the source:
:meth:`ace3_worker.shard_fetch.S3ShardSource.open_range`), at most :data:`RANGE_READERS` parts
in flight. Each part streams in chunks of :data:`CHUNK_BYTES` read straight into reused
buffers (``readinto``: no bytes object per chunk, no part held whole), each written at its
offset into the entry's reserved part file by the thread that read it and handed to the
caller's thread, which hashes them (sha256) in order; a part runs at most
:data:`CHUNKS_AHEAD` chunks ahead of the hash. Meanwhile the bytes written so far are flushed
(one ``fdatasync`` at a time), so that the ``fsync`` after the last part has little left to
do, where the cache fsyncs its entries at all (:mod:`ace3_worker.shard_cache_boot`: not where
it is tagged with this boot).

By default one part is in flight and a part is up to 1 GiB: a shard is one streaming GET
(more for a larger one), read by one thread while the caller hashes. Parallel ranges cost
CPU (six readers contending for the interpreter, as boto3's ``download_file`` reads) that
the two measured cores could not spare: on SeaweedFS on the same 2 cores, idle, one reader
read 128 MiB objects at 0.81-0.93 of ``download_file``'s rate and 10 MiB ones at 0.85-1.01,
where six readers of 8 MiB parts read them at 0.70-0.83 and 0.66-0.68 (benchmarks/README.md).
Shards fetch in parallel anyway: the feeder fetches up to 4 at once. The machinery for more
readers stays (the tests drive it with six), for a store whose single stream is slow.

A shard under :data:`RANGED_MIN_BYTES` (and every shard of the artifact store) is one
streaming read, whose chunks a thread of their own reads ahead (:func:`read_ahead`, at most
:data:`READ_AHEAD_CHUNKS` of them), so that the socket's reads overlap the hashing and the
writing.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from ace3.config.shards import Shard

MiB = 1024 * 1024
RANGED_MIN_BYTES = 1 * MiB
PART_BYTES = 1024 * MiB
MIN_PART_BYTES = 4 * MiB
RANGE_READERS = 1
CHUNK_BYTES = MiB
CHUNKS_AHEAD = 4
SYNC_BYTES = 32 * MiB
READ_AHEAD_CHUNKS = 8
_PUT_SECONDS = 0.1  # (how often a blocked reader looks whether it was closed or the copy ended)


class Part(Protocol):
    """One part's bytes as they arrive (``io.BytesIO`` is one)."""

    def readinto(self, buffer: memoryview, /) -> int:
        """Up to ``len(buffer)`` of the next bytes into ``buffer``; 0 at the end."""

    def close(self) -> None: ...


# (first byte, last byte) -> a stream of exactly those bytes of the shard
OpenPart = Callable[[int, int], Part]
_Arrived = tuple[bytearray, int] | BaseException


def part_ranges(size: int) -> list[tuple[int, int]]:
    """The (first, last) byte ranges, inclusive, that cover ``size`` bytes: parts of
    :data:`PART_BYTES`, smaller for a shard that has fewer than :data:`RANGE_READERS` of them
    (each reader gets one, but no part under :data:`MIN_PART_BYTES`)."""
    part = max(MIN_PART_BYTES, min(PART_BYTES, -(-size // RANGE_READERS)))
    return [(first, min(first + part, size) - 1) for first in range(0, size, part)]


def _write_at(fd: int, view: memoryview, offset: int) -> None:
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


class _Copy:
    """One shard's parts, read by a pool of threads; the caller's thread hashes them."""

    def __init__(self, open_part: OpenPart, shard: Shard, fd: int, stop: threading.Event,
                 stopped: Callable[[], BaseException]) -> None:  # fmt: skip
        self.open_part, self.shard, self.fd = open_part, shard, fd
        self.stop, self.stopped, self.ended = stop, stopped, threading.Event()
        self.ranges = part_ranges(shard.size)
        self.arrived: list[queue.SimpleQueue[_Arrived]] = [queue.SimpleQueue() for _ in self.ranges]
        self.room = [threading.Semaphore(CHUNKS_AHEAD) for _ in self.ranges]
        self.spare: queue.SimpleQueue[bytearray] = queue.SimpleQueue()

    def _buffer(self, index: int) -> bytearray | None:
        """A spare buffer once the part is fewer than CHUNKS_AHEAD chunks ahead of the hash;
        None when the copy ended meanwhile."""
        while not self.room[index].acquire(timeout=_PUT_SECONDS):
            if self.ended.is_set():
                return None
        try:
            return self.spare.get_nowait()
        except queue.Empty:  # (at most RANGE_READERS * CHUNKS_AHEAD of them, made as needed)
            return bytearray(CHUNK_BYTES)

    def read(self, index: int) -> None:
        """Part ``index`` into the file, chunk by chunk, each handed to the hash."""
        first, last = self.ranges[index]
        arrived, offset, end = self.arrived[index], first, last + 1
        try:
            part = self.open_part(first, last)
            try:
                while offset < end:
                    if self.stop.is_set():
                        raise self.stopped()
                    buffer = self._buffer(index)
                    if buffer is None:
                        return
                    with memoryview(buffer) as whole:
                        count = part.readinto(whole[: min(CHUNK_BYTES, end - offset)])
                        if not count:
                            raise OSError(
                                f"shard {self.shard.name!r}: bytes {first}-{last} came as "
                                f"{offset - first} bytes"
                            )
                        _write_at(self.fd, whole[:count], offset)
                    arrived.put((buffer, count))
                    offset += count
            finally:
                part.close()
        except BaseException as exc:  # (the hash raises it, whatever it was)
            arrived.put(exc)

    def hash(self, index: int, digest: hashlib._Hash) -> None:
        """Part ``index``'s chunks into ``digest`` in order, as they arrive."""
        first, last = self.ranges[index]
        left = last - first + 1
        while left:
            item = self.arrived[index].get()
            if isinstance(item, BaseException):
                raise item
            if self.stop.is_set():
                raise self.stopped()
            buffer, count = item
            with memoryview(buffer) as whole:
                digest.update(whole[:count])
            self.spare.put(buffer)
            self.room[index].release()
            left -= count


def copy_ranges(
    open_part: OpenPart,
    shard: Shard,
    fd: int,
    stop: threading.Event,
    *,
    stopped: Callable[[], BaseException],
    flush: bool = True,
) -> str:
    """The shard's bytes into ``fd`` (at their offsets), read part by part with ``open_part``
    (several at once); their sha256. Raises what ``open_part`` or reading a part raises,
    ``stopped()`` when ``stop`` is set meanwhile, ``OSError`` when a part arrives short. The
    part's stream must not give more than it was asked for (the source checks its length).
    ``flush``: the entry will be fsynced, so the bytes written so far are flushed while the rest
    arrive."""
    copy = _Copy(open_part, shard, fd, stop, stopped)
    digest = hashlib.sha256()
    pool = ThreadPoolExecutor(RANGE_READERS, thread_name_prefix="shard-ranges")
    # The bytes written so far go to disk while the rest arrive, so that the fsync after the
    # last part (ShardCache.commit) waits for little: one fdatasync at a time, every
    # SYNC_BYTES hashed.
    syncer = ThreadPoolExecutor(1, thread_name_prefix="shard-sync")
    syncing: Future[None] | None = None
    hashed = synced = 0
    try:
        # (parts start as the hash moves on: at most RANGE_READERS of them ahead of it)
        for index in range(min(RANGE_READERS, len(copy.ranges))):
            pool.submit(copy.read, index)
        for index, (first, last) in enumerate(copy.ranges):
            copy.hash(index, digest)
            hashed += last - first + 1
            if index + RANGE_READERS < len(copy.ranges):
                pool.submit(copy.read, index + RANGE_READERS)
            if flush and hashed - synced >= SYNC_BYTES and (syncing is None or syncing.done()):
                syncing, synced = syncer.submit(os.fdatasync, fd), hashed
        if syncing is not None:
            syncing.result()
    finally:
        copy.ended.set()
        pool.shutdown(wait=True, cancel_futures=True)
        syncer.shutdown(wait=True)
    return digest.hexdigest()


def read_ahead(chunks: Iterator[bytes], closed: threading.Event) -> Iterator[bytes]:
    """``chunks``, read by a thread of their own (started at the first ``next``), at most
    :data:`READ_AHEAD_CHUNKS` ahead of the caller; what reading them raised is raised here.
    Set ``closed`` when done with them (the thread then stops at its next chunk)."""
    items: queue.Queue[bytes | BaseException | None] = queue.Queue(READ_AHEAD_CHUNKS)

    def put(item: bytes | BaseException | None) -> bool:
        while not closed.is_set():
            try:
                items.put(item, timeout=_PUT_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for chunk in chunks:
                if not put(chunk):
                    return
        except BaseException as exc:  # (the caller gets it, whatever it was)
            put(exc)
            return
        put(None)

    threading.Thread(target=read, name="shard-read-ahead", daemon=True).start()
    while (item := items.get()) is not None:
        if isinstance(item, BaseException):
            raise item
        yield item
