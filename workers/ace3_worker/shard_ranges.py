"""Large shards fetched as parallel ranged reads (:func:`copy_ranges`), as boto3's own
``download_file`` does: one streaming GET of an object store such as SeaweedFS or S3 delivers a
fraction of what several ranges at once do (on the benchmark's SeaweedFS, 128 MiB objects came
at about 100 MiB/s through one GET, against about 200 through boto3's ranges:
``benchmarks/data_streaming.py``).

A shard of at least :data:`RANGED_MIN_BYTES` is read as parts of :data:`PART_BYTES`, at most
:data:`RANGE_READERS` reads in flight (the source checks each part against the manifest:
:meth:`ace3_worker.shard_fetch.S3ShardSource.read_range`). Each part is written at its offset
into the entry's reserved part file as it arrives, and hashed (sha256) in order: at most
:data:`PARTS_AHEAD` parts are held in memory, waiting for their turn in the hash.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ace3.config.shards import Shard

MiB = 1024 * 1024
RANGED_MIN_BYTES = 8 * MiB
PART_BYTES = 4 * MiB
RANGE_READERS = 4
PARTS_AHEAD = RANGE_READERS + 1

# (first byte, last byte) -> exactly those bytes of the shard
ReadPart = Callable[[int, int], bytes]


def part_ranges(size: int, part: int | None = None) -> list[tuple[int, int]]:
    """The (first, last) byte ranges, inclusive, that cover ``size`` bytes in parts of ``part``."""
    part = part or PART_BYTES
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
) -> str:
    """The shard's bytes into ``fd`` (at their offsets), read part by part with ``read_part``
    (several at once); their sha256. Raises what ``read_part`` raises, ``stopped()`` when
    ``stop`` is set meanwhile, ``OSError`` when a part arrives short or long."""
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
            following = next(upcoming, None)
            if following is not None:
                pending.append(pool.submit(fetch, *following))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return digest.hexdigest()
