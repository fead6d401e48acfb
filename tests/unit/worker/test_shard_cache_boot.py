"""The shard cache writes its entries without fsync and trusts them only in the boot that
wrote them (:mod:`ace3_worker.shard_cache_boot`): an earlier boot's entries are removed before
any is looked up; a cache from a worker that fsynced every entry (no boot file) is kept; where
the kernel has no boot id, entries are fsynced as before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ace3_worker import shard_cache, shard_cache_boot
from ace3_worker.shard_cache import ShardCache
from ace3_worker.shard_cache_boot import BOOT_FILE, current_boot
from tests.unit.worker.test_shard_cache import DIGEST, SIZE, FakeSource, get

pytestmark = pytest.mark.skipif(current_boot() is None, reason="a kernel without a boot id")


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every fsync the cache's modules make, by descriptor."""
    calls: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(shard_cache.os, "fsync", fsync)
    return calls


def test_entries_of_this_boot_are_not_fsynced_and_an_earlier_boots_are_removed(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    root = tmp_path / "cache"
    source = FakeSource(root)
    first = get(ShardCache(root, 10 * SIZE), source, "a")
    assert first is not None and first.fetched
    assert (root / BOOT_FILE).read_text().strip() == current_boot()
    marker_syncs = len(fsyncs)  # (the boot file's own: written durably, once)
    second = get(ShardCache(root, 10 * SIZE), source, "b")
    assert second is not None and second.fetched and len(fsyncs) == marker_syncs
    found = get(ShardCache(root, 10 * SIZE), source, "a")
    assert found is not None and not found.fetched, "this boot's entry is trusted"

    (root / BOOT_FILE).write_text("an-earlier-boot\n")  # (the machine rebooted since)
    again = get(ShardCache(root, 10 * SIZE), source, "a")
    assert again is not None and again.fetched, "an earlier boot's entry was trusted"
    assert not (root / DIGEST / "b.bin").exists()
    assert (root / BOOT_FILE).read_text().strip() == current_boot()
    assert source.opened == ["a", "b", "a"]


def test_a_cache_without_a_boot_file_was_fsynced_and_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    source = FakeSource(root)
    assert get(ShardCache(root, 10 * SIZE), source, "a") is not None
    (root / BOOT_FILE).unlink()  # (as a worker that fsynced each entry left it)
    found = get(ShardCache(root, 10 * SIZE), source, "a")
    assert found is not None and not found.fetched
    assert (root / BOOT_FILE).read_text().strip() == current_boot()


def test_without_a_boot_id_every_entry_is_fsynced(
    tmp_path: Path, fsyncs: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_cache_boot, "BOOT_ID", tmp_path / "no-such-file")
    root = tmp_path / "cache"
    obtained = get(ShardCache(root, 10 * SIZE), FakeSource(root), "a")
    assert obtained is not None and obtained.fetched
    assert len(fsyncs) >= 2, "the entry and its directory"  # (shard_cache.os is os itself)
    assert not (root / BOOT_FILE).exists()
