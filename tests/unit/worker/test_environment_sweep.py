"""What a killed worker leaves of its environment work is swept once per worker process, and
only what no live process holds: the cache's half-done unpacks, fetched archives and evictions
(under the entry's lock) and the build scratch directories of the work filesystem (each held by
its builder's lock), read-only trees included. And the environment's identity covers where its
wheels come from and what the machine can load, not the credentials of an index URL."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from ace3_control.environment_settings import EnvironmentSettings
from ace3_control.settings import Settings
from ace3_worker.attempt_run import AttemptRunner
from ace3_worker.environments.cache import EnvironmentCache, remove_tree
from ace3_worker.environments.identity import environment_identity, without_credentials
from ace3_worker.environments.scratch import BUILDS_DIR, build_scratch, sweep_build_scratch

HASH = "a" * 64


def _read_only_tree(root: Path) -> Path:
    """A tree as a build leaves it: 0555 directories, 0444 files, a link out of it."""
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "sub" / "m.py").write_text("x = 1\n")
    os.symlink("/etc", root / "pkg" / "out")
    for path in (root / "pkg" / "sub" / "m.py",):
        path.chmod(0o444)
    for path in (root / "pkg" / "sub", root / "pkg", root):
        path.chmod(0o555)
    return root


def test_remove_tree_removes_a_read_only_tree_without_following_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o555)
    tree = _read_only_tree(tmp_path / "tree")
    os.symlink(outside, tree.parent / "link-to-outside")
    assert remove_tree(tree) and not tree.exists()
    assert remove_tree(tree.parent / "link-to-outside")
    assert outside.is_dir() and outside.stat().st_mode & 0o777 == 0o555, "never followed"


def test_the_cache_sweep_removes_leftovers_nobody_holds(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path / "cache", bound=10**9)
    cache._ready_root()
    unpack = _read_only_tree(cache.scratch(HASH))
    archive = cache.scratch_archive(HASH)
    archive.write_bytes(b"partial")
    evicted = _read_only_tree(cache.root / f".{HASH}.evicted-0a1b2c3d")
    orphan_size = cache.root / f".{HASH}.bytes"
    orphan_size.write_text("10")
    busy = "b" * 64  # (another live process installs it)
    busy_unpack = _read_only_tree(cache.scratch(busy))
    holder = os.open(cache._lock_path(busy), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        removed = cache.sweep()
    finally:
        os.close(holder)
    assert sorted(removed) == sorted([unpack, archive, evicted, orphan_size])
    assert busy_unpack.is_dir(), "another process's install in progress is left alone"
    assert cache.sweep() == [busy_unpack], "gone once nobody holds it"


def test_builds_run_in_locked_scratch_of_the_work_dir_and_dead_ones_are_swept(
    tmp_path: Path,
) -> None:
    work = tmp_path / "jobs"
    dead = work / BUILDS_DIR / "dead"
    with build_scratch(work) as scratch:
        assert scratch.parent == work / BUILDS_DIR
        assert (work / BUILDS_DIR).stat().st_mode & 0o777 == 0o711
        assert scratch.stat().st_mode & 0o777 == 0o755
        dead.mkdir()
        _read_only_tree(dead / "work")
        assert sweep_build_scratch(work) == [dead], "a live build's scratch stays"
        assert scratch.is_dir()
        _read_only_tree(scratch / "work")
    assert not scratch.exists(), "removed when done, read-only or not"


def test_the_first_attempt_of_a_worker_process_sweeps_both(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    cache = EnvironmentCache(settings.resolved_env_cache_dir, settings.env_cache_bytes)
    cache._ready_root()
    unpack = _read_only_tree(cache.scratch(HASH))
    dead = settings.resolved_work_dir / BUILDS_DIR / "dead"
    dead.mkdir(parents=True)
    none: Any = None
    runner = AttemptRunner(settings, none, none, none, none, none)
    runner.sweep()
    assert not unpack.exists() and not dead.exists()


def test_the_identity_covers_wheel_sources_and_the_abi_not_credentials() -> None:
    installed = {"torch": "2.13.0"}

    def digest(abi: str | None = None, **sources: Any) -> str:
        settings = EnvironmentSettings(**sources)
        return environment_identity(
            ["einops"], installed=installed, settings=settings, abi=abi
        ).hash

    base = digest()
    assert digest(pip_index_url="https://pypi.example/simple") != base
    assert digest(pip_index_url="https://u:p@pypi.example/simple") == digest(
        pip_index_url="https://other:secret@pypi.example/simple"
    )
    assert digest(pip_extra_index_url="https://extra.example/simple") != base
    assert digest(pip_find_links="/srv/wheels") != base
    assert digest(pip_offline=True) != base
    assert digest(pip_allow_source_builds=True) != base
    assert digest(abi="cpython-311-x86_64-linux-gnu glibc-2.17 cp311-cp311-linux_x86_64") != base
    identity = environment_identity(["einops"], installed=installed)
    assert "glibc" in identity.abi or "libc" in identity.abi
    assert without_credentials("https://u:p@h.example:8443/s?q=1") == "https://h.example:8443/s?q=1"


def test_a_scratch_a_sweep_removed_before_its_lock_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(the window between mkdir and flock): the builder never uses a removed directory."""
    import ace3_worker.environments.scratch as scratch_module

    made: list[Path] = []
    real_mkdir = Path.mkdir

    def mkdir_then_swept(self: Path, *args: Any, **kwargs: Any) -> None:
        real_mkdir(self, *args, **kwargs)
        if self.parent.name == BUILDS_DIR and not made:
            made.append(self)
            threading.Thread(target=sweep_build_scratch, args=(tmp_path,)).run()

    monkeypatch.setattr(Path, "mkdir", mkdir_then_swept)
    with scratch_module.build_scratch(tmp_path) as scratch:
        assert scratch.is_dir() and scratch != made[0]
