"""An attempt's directory goes whole, read-only inputs included, also for a worker that is not
root (whose jobs share its uid): such a worker cannot unlink what a 0555 directory holds, and
the environment's hard links left behind would keep evicted cache trees on disk. The test runs
as root here, so a non-root worker's refusal is emulated: an unlink or rmdir in a directory
without its write bit fails as the kernel would fail it for the owner."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from ace3_worker.attempt_dirs import sweep_attempts
from ace3_worker.job_dir import remove_attempt_directory


def _writable(dir_fd: int | None, path: str) -> bool:
    mode = (
        os.fstat(dir_fd).st_mode if dir_fd is not None else os.stat(os.path.dirname(path)).st_mode
    )
    return bool(mode & stat.S_IWUSR)


def _attempt(root: Path) -> None:
    for part in ("env/pkg", "code", "output"):
        (root / part).mkdir(parents=True)
    (root / "env" / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "code" / "model.py").write_text("pass\n")
    (root / "output" / "events.jsonl").write_text("{}\n")
    for frozen in (root / "env" / "pkg", root / "env", root / "code"):
        frozen.chmod(0o555)


def _as_non_root_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    real_unlink, real_rmdir = os.unlink, os.rmdir

    def as_owner(real: Any) -> Any:
        def call(path: Any, *, dir_fd: int | None = None) -> None:
            if not _writable(dir_fd, os.fspath(path)):
                raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
            real(path, dir_fd=dir_fd)

        return call

    monkeypatch.setattr(os, "unlink", as_owner(real_unlink))
    monkeypatch.setattr(os, "rmdir", as_owner(real_rmdir))


def test_read_only_inputs_are_removed_as_a_non_root_owner_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "job" / "attempt-1"
    _attempt(root)
    _as_non_root_owner(monkeypatch)
    remove_attempt_directory(root)
    assert not root.exists() and not root.parent.exists()


def test_a_dead_workers_attempt_is_swept_whole_as_a_non_root_owner_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "work" / "job" / "attempt-2"
    _attempt(root)
    _as_non_root_owner(monkeypatch)
    assert sweep_attempts(tmp_path / "work", min_age=0) == [root]
    assert not root.exists()
