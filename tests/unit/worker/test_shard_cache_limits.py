"""The node cache's limits on many tiny shards and on waiting: an entry counts as at least
1 MiB (a cache of 1 GiB or more), the lock file of an entry that is gone is removed (and a
process that locked a lock file removed meanwhile locks the one at its path), and a current
shard waits for room only ``wait_seconds``."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ace3_worker import shard_cache
from ace3_worker.shard_cache import CacheFullError, ShardCache
from ace3_worker.shard_fetch import ShardChangedError, obtain
from tests.unit.worker.test_shard_cache import DIGEST, SIZE, FakeSource, get, shard


def locks(cache: ShardCache) -> set[str]:
    return {p.name for p in (cache.root / DIGEST).glob(".*.lock")}


def test_tiny_shards_count_as_a_mebibyte_and_evicted_ones_leave_no_lock_file(
    tmp_path: Path,
) -> None:
    cache = ShardCache(tmp_path / "cache", bound=3 * 1024**3)
    cache.floor = cache.bound // 3  # (a 1 MiB floor scaled down to what 3 tiny shards show)
    source = FakeSource(cache.root)
    for name in ("a", "b", "c"):
        assert get(cache, source, name) is not None
    assert cache.usage() == 3 * cache.floor
    assert ShardCache(tmp_path / "other", bound=3 * 1024**3).floor == 1024 * 1024
    assert ShardCache(tmp_path / "other", bound=10 * SIZE).floor == 1  # (a tiny test cache)
    assert locks(cache) == {".a.bin.lock", ".b.bin.lock", ".c.bin.lock"}

    os.utime(cache.root / DIGEST / "a.bin.sha256", (1, 1))  # the least recently used
    assert get(cache, source, "d") is not None  # 4 entries do not fit: "a" goes
    assert {p.name for p in (cache.root / DIGEST).glob("*.bin")} == {"b.bin", "c.bin", "d.bin"}
    assert locks(cache) == {".b.bin.lock", ".c.bin.lock", ".d.bin.lock"}


def test_a_failed_fetch_leaves_no_lock_file(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", bound=10 * SIZE)
    with pytest.raises(ShardChangedError):  # (the source's object is another size)
        obtain(
            cache, FakeSource(cache.root), DIGEST, "x.bin", shard("x", size=SIZE + 1),
            stop=threading.Event(), wait=False,
        )  # fmt: skip
    assert locks(cache) == set() and list((cache.root / DIGEST).iterdir()) == []


def test_a_lock_file_removed_while_it_was_locked_is_locked_again_at_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ".x.lock"
    real_open = os.open
    raced = []

    def open_then_lose_the_race(file: object, flags: int, *args: object, **kw: object) -> int:
        fd = real_open(file, flags, *args, **kw)  # type: ignore[arg-type]
        if file == path and not raced:  # another process removes it, as an evictor does
            raced.append(True)
            path.unlink()
            path.write_text("")
        return fd

    monkeypatch.setattr(shard_cache.os, "open", open_then_lose_the_race)
    fd = shard_cache._flock(path, shard_cache.fcntl.LOCK_EX)
    assert fd is not None and raced
    try:
        assert os.fstat(fd).st_ino == os.stat(path).st_ino  # the file at the path, not the lost one
    finally:
        shard_cache._unlock(fd)


def test_a_current_shard_waits_for_room_only_so_long(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path / "cache", bound=SIZE)
    source = FakeSource(cache.root)
    held = get(cache, source, "a")
    assert held is not None
    os.link(held.cached.path, tmp_path / "linked")  # a running job reads it: never evicted
    with cache.locked(DIGEST, "b.bin"), pytest.raises(CacheFullError) as failure:
        cache.reserve(DIGEST, "b.bin", SIZE, stop=threading.Event(), wait=True, wait_seconds=0.1)
    assert "ACE3_DATASET_CACHE_WAIT_SECONDS" in str(failure.value)
    assert "ACE3_DATASET_CACHE_BYTES" in str(failure.value)
