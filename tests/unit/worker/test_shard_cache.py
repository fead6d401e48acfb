"""The node's shard cache: least recently used shards no job links go first, a linked one never;
the bytes on disk never pass the bound (a fetch reserves its room before its bytes arrive); a
fetch waits for room when every byte is linked, a look-ahead does not; one fetch per shard
however many fetchers (threads or processes: the entry's flock) want it."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ace3.config.shards import Shard
from ace3_worker.shard_cache import CacheTooSmallError, ShardCache
from ace3_worker.shard_cache_boot import BOOT_FILE
from ace3_worker.shard_fetch import (
    FetchStopped,
    Obtained,
    ShardChangedError,
    ShardObject,
    obtain,
)
from ace3_worker.shard_place import place

DIGEST = "ab" * 32
SIZE = 100


def disk_bytes(root: Path) -> int:
    """What the cache's files hold on disk now (shards and parts, not the tiny sidecars, locks
    and boot file)."""
    total = 0
    for directory, _, names in os.walk(root):
        for name in names:
            if not name.endswith((".sha256", ".lock", ".tmp")) and name != BOOT_FILE:
                total += os.lstat(Path(directory) / name).st_size
    return total


class FakeSource:
    """Shards of SIZE bytes, written in chunks; measures the cache's disk use at every chunk;
    ``gate`` (when given) holds a fetch until it is set."""

    uri = "s3://bucket/data/"

    def __init__(self, cache_root: Path, gate: threading.Event | None = None) -> None:
        self.cache_root = cache_root
        self.gate = gate
        self.opened: list[str] = []
        self.peak = 0
        self.lock = threading.Lock()

    @staticmethod
    def content(name: str) -> bytes:
        return (name.encode() * SIZE)[:SIZE]

    def open(self, shard: Shard) -> ShardObject:
        with self.lock:
            self.opened.append(shard.name)

        def chunks() -> Iterator[bytes]:
            data = self.content(shard.name)
            for start in range(0, SIZE, 25):
                if self.gate is not None:
                    self.gate.wait(10)
                yield data[start : start + 25]
                self.peak = max(self.peak, disk_bytes(self.cache_root))

        return ShardObject("etag-" + shard.name, SIZE, chunks(), lambda: None)


def shard(name: str, size: int = SIZE) -> Shard:
    return Shard(name=name, size=size, etag="etag-" + name)


def get(cache: ShardCache, source: FakeSource, name: str, wait: bool = True) -> Obtained | None:
    return obtain(
        cache, source, DIGEST, f"{name}.bin", shard(name), stop=threading.Event(), wait=wait
    )


def test_least_recently_used_unlinked_shards_are_evicted_and_the_bound_holds(
    tmp_path: Path,
) -> None:
    cache = ShardCache(tmp_path / "cache", bound=3 * SIZE)
    source = FakeSource(cache.root)
    job = tmp_path / "job"
    job.mkdir()
    for name in ("a", "b", "c"):
        got = get(cache, source, name)
        assert got is not None and got.fetched
        assert got.cached.sha256 == hashlib.sha256(FakeSource.content(name)).hexdigest()
    place(cache.path(DIGEST, "a.bin"), job / "a.bin")  # a job reads a: never evicted
    os.utime(cache.root / DIGEST / "c.bin.sha256", (1, 1))  # c: used before b
    assert get(cache, source, "d") is not None
    assert sorted(p.name for p in (cache.root / DIGEST).glob("*.bin")) == [
        "a.bin",
        "b.bin",
        "d.bin",
    ]
    assert get(cache, source, "e") is not None  # b goes next (a is still linked)
    assert sorted(p.name for p in (cache.root / DIGEST).glob("*.bin")) == [
        "a.bin",
        "d.bin",
        "e.bin",
    ]
    assert source.peak <= cache.bound and cache.usage() == 3 * SIZE
    again = get(cache, source, "d")  # a hit: nothing fetched
    assert again is not None and not again.fetched and source.opened.count("d") == 1
    assert (job / "a.bin").read_bytes() == FakeSource.content("a")
    assert oct((job / "a.bin").stat().st_mode & 0o777) == "0o444"


def test_a_current_shard_waits_for_room_a_look_ahead_does_not(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", bound=2 * SIZE)
    source = FakeSource(cache.root)
    job = tmp_path / "job"
    job.mkdir()
    for name in ("a", "b"):
        get(cache, source, name)
        place(cache.path(DIGEST, f"{name}.bin"), job / f"{name}.bin")
    assert get(cache, source, "c", wait=False) is None  # every byte is linked
    done = threading.Event()
    result: list[Obtained | None] = []

    def fetch() -> None:
        result.append(get(cache, source, "c", wait=True))
        done.set()

    thread = threading.Thread(target=fetch)
    thread.start()
    assert not done.wait(0.5)  # still waiting: nothing may be evicted
    (job / "a.bin").unlink()  # the job moved on from a
    assert done.wait(10)
    thread.join()
    assert result[0] is not None and result[0].fetched
    assert sorted(p.name for p in (cache.root / DIGEST).glob("*.bin")) == ["b.bin", "c.bin"]
    assert source.peak <= cache.bound


def test_concurrent_fetchers_of_one_shard_fetch_it_once(tmp_path: Path) -> None:
    gate = threading.Event()
    source = FakeSource(tmp_path / "cache", gate)
    results: list[Obtained | None] = []

    def fetch() -> None:  # each its own cache object, as each worker process has
        results.append(get(ShardCache(tmp_path / "cache", bound=10 * SIZE), source, "a"))

    threads = [threading.Thread(target=fetch) for _ in range(3)]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join(10)
    assert source.opened == ["a"]
    assert sorted(r.fetched for r in results if r is not None) == [False, False, True]


def test_a_shard_larger_than_the_cache_and_a_changed_one_are_refused(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", bound=SIZE - 1)
    source = FakeSource(cache.root)
    with pytest.raises(CacheTooSmallError, match="ACE3_DATASET_CACHE_BYTES=99"):
        get(cache, source, "a")
    cache = ShardCache(tmp_path / "cache", bound=10 * SIZE)
    changed = Shard(name="train/a", size=SIZE, etag="another")
    with pytest.raises(ShardChangedError, match=r"'train/a'.*ETag is 'etag-train/a'"):
        obtain(cache, source, DIGEST, "a.bin", changed, stop=threading.Event(), wait=True)
    assert cache.usage() == 0 and not list((cache.root / DIGEST).glob("*.bin"))


def test_a_stopped_fetch_and_a_dead_process_leave_no_bytes(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", bound=10 * SIZE)
    stop = threading.Event()
    stop.set()
    with pytest.raises(FetchStopped):
        obtain(cache, FakeSource(cache.root), DIGEST, "a.bin", shard("a"), stop=stop, wait=True)
    assert disk_bytes(cache.root) == 0
    stale = cache.root / DIGEST / f".b.bin.{SIZE}.part"  # a fetcher that died (no lock held)
    stale.write_bytes(b"x" * 10)
    assert cache.usage() == 0 and not stale.exists()
