"""Reading a shard's bytes fast. Large shards are fetched as parallel ranged reads
(:func:`copy_ranges`), as boto3's own
``download_file`` does: one streaming GET of an object store such as SeaweedFS or S3 delivers a
fraction of what several ranges at once do (on the benchmark's SeaweedFS, 128 MiB objects came
at about 100 MiB/s through one GET, against about 200 through boto3's ranges:
``benchmarks/data_streaming.py``).

A shard of at least :data:`RANGED_MIN_BYTES` is read as parts of :data:`PART_BYTES`, at most
:data:`RANGE_READERS` reads in flight (the source checks each part against the manifest:
:meth:`ace3_worker.shard_fetch.S3ShardSource.read_range`). Each part is written at its offset
into the entry's reserved part file as it arrives, and hashed (sha256) in order: at most
:data:`PARTS_AHEAD` parts are held in memory, waiting for their turn in the hash. Meanwhile
the bytes written so far are flushed (one ``fdatasync`` at a time), so that the ``fsync`` after
the last part has little left to do, where the cache fsyncs its entries at all
(:mod:`ace3_worker.shard_cache_boot`: not where it is tagged with this boot).

A smaller shard is one streaming read, whose chunks a thread of their own reads ahead
(:func:`read_ahead`, at most :data:`READ_AHEAD_CHUNKS` of them), so that the socket's reads
overlap the hashing and the writing (one 10 MiB shard at a time from SeaweedFS: 0.65 of boto3's
``download_file`` without, 0.77 with).
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from ace3.config.shards import Shard

MiB = 1024 * 1024
RANGED_MIN_BYTES = 32 * MiB
PART_BYTES = 8 * MiB
MIN_PART_BYTES = 4 * MiB
RANGE_READERS = 6
PARTS_AHEAD = RANGE_READERS + 1
SYNC_BYTES = 32 * MiB
READ_AHEAD_CHUNKS = 8
_PUT_SECONDS = 0.1  # (how often a reader blocked on a full queue looks whether it was closed)

# (first byte, last byte) -> exactly those bytes of the shard
ReadPart = Callable[[int, int], bytes]


def part_ranges(size: int) -> list[tuple[int, int]]:
    """The (first, last) byte ranges, inclusive, that cover ``size`` bytes: parts of
    :data:`PART_BYTES`, smaller for a shard that has fewer than :data:`RANGE_READERS` of them
    (each reader gets one, but no part under :data:`MIN_PART_BYTES`)."""
    part = max(MIN_PART_BYTES, min(PART_BYTES, -(-size // RANGE_READERS)))
    return [(first, min(first + part, size) - 1) for first in range(0, size, part)]


def _write_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def copy_ranges(
    read_part: ReadPart,
    shard: Shard,
    fd: int,
    stop: threading.Event,
    *,
    stopped: Callable[[], BaseException],
    flush: bool = True,
) -> str:
    """The shard's bytes into ``fd`` (at their offsets), read part by part with ``read_part``
    (several at once); their sha256. Raises what ``read_part`` raises, ``stopped()`` when
    ``stop`` is set meanwhile, ``OSError`` when a part arrives short or long. ``flush``: the
    entry will be fsynced, so the bytes written so far are flushed while the rest arrive."""
    ranges = part_ranges(shard.size)
    digest = hashlib.sha256()

    def fetch(first: int, last: int) -> bytes:
        if stop.is_set():
            raise stopped()
        data = read_part(first, last)
        if len(data) != last - first + 1:
            raise OSError(f"shard {shard.name!r}: bytes {first}-{last} came as {len(data)} bytes")
        _write_at(fd, data, first)
        return data

    pool = ThreadPoolExecutor(RANGE_READERS, thread_name_prefix="shard-ranges")
    # The bytes written so far go to disk while the rest arrive, so that the fsync after the
    # last part (ShardCache.commit) waits for little: one fdatasync at a time, every
    # SYNC_BYTES hashed.
    syncer = ThreadPoolExecutor(1, thread_name_prefix="shard-sync")
    syncing: Future[None] | None = None
    hashed = synced = 0
    pending: deque[Future[bytes]] = deque()
    try:
        upcoming = iter(ranges)
        for first, last in upcoming:
            pending.append(pool.submit(fetch, first, last))
            if len(pending) >= PARTS_AHEAD:
                break
        while pending:
            data = pending.popleft().result()  # (in order: the hash needs them so)
            if stop.is_set():
                raise stopped()
            digest.update(data)
            hashed += len(data)
            following = next(upcoming, None)
            if following is not None:
                pending.append(pool.submit(fetch, *following))
            if flush and hashed - synced >= SYNC_BYTES and (syncing is None or syncing.done()):
                syncing, synced = syncer.submit(os.fdatasync, fd), hashed
        if syncing is not None:
            syncing.result()
    finally:
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
