"""Attempt directories a dead worker left (their shard links pinning cache entries) are removed
when a worker process starts; those a live attempt holds, and new ones, are not. A cache on
another filesystem than the work directory is said at start."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from ace3_worker.attempt_dirs import hold_attempt, sweep_attempts, warn_if_copies


def attempt(work: Path, job: str, name: str, old: bool = True) -> Path:
    root = work / job / name
    (root / "data" / "train" / "shards").mkdir(parents=True)
    if old:
        os.utime(root, (1, 1))
    return root


def test_a_dead_workers_attempts_are_swept_a_live_ones_kept(tmp_path: Path) -> None:
    work = tmp_path / "jobs"
    entry = tmp_path / "cache" / "000000.bin"
    entry.parent.mkdir()
    entry.write_bytes(b"shard")
    dead = attempt(work, "job1", "attempt-1")
    os.link(entry, dead / "data" / "train" / "shards" / "000000.bin")
    live = attempt(work, "job2", "attempt-3-node-1")
    young = attempt(work, "job3", "attempt-1", old=False)
    assert entry.stat().st_nlink == 2

    with hold_attempt(live):
        assert sweep_attempts(work) == [dead]
    assert entry.stat().st_nlink == 1  # (evictable again)
    assert not (work / "job1").exists() and live.is_dir() and young.is_dir()
    assert list((work / ".attempt-locks").iterdir()) == []  # (released: removed)
    assert sweep_attempts(work) == [live]  # (no one holds it any more)


def test_a_cache_on_another_filesystem_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    assert not warn_if_copies(tmp_path / "cache", tmp_path / "jobs")
    assert caplog.text == ""
    other = Path("/dev/shm")
    if not other.is_dir() or other.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem here")
    assert warn_if_copies(other / "ace3-cache", tmp_path / "jobs")
    assert "ACE3_DATASET_CACHE_DIR on the filesystem of ACE3_WORK_DIR" in caplog.text
