"""ace3.files: the one sha256 and atomic-write helper of the SDK, engine, server and worker."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ace3.files import atomic_path, sha256_file, write_atomic, write_bytes_atomic


def test_write_atomic_reports_what_is_on_disk(tmp_path: Path) -> None:
    written = write_atomic(tmp_path / "a" / "file.bin", lambda handle: handle.write(b"x" * 3000))
    assert written.path == (tmp_path / "a" / "file.bin").resolve()
    assert written.size_bytes == 3000
    assert written.sha256 == hashlib.sha256(b"x" * 3000).hexdigest() == sha256_file(written.path)
    assert os.listdir(tmp_path / "a") == ["file.bin"], "no temporary file left"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "model.pt"
    write_bytes_atomic(target, b"old")

    def half_then_fail(handle):  # type: ignore[no-untyped-def]
        handle.write(b"new but incompl")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, half_then_fail)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["model.pt"]


def test_atomic_path_writes_by_name_with_the_usual_permissions(tmp_path: Path) -> None:
    target = tmp_path / "trace.json"
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".trace.json.tmp-")
        assert not target.exists(), "nothing at the target until the write is complete"
        tmp.write_text("{}")
    assert target.read_text() == "{}"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask, "not mkstemp's 0600"


def test_atomic_path_never_follows_a_planted_link(tmp_path: Path) -> None:
    """The temporary name is random and created exclusively: a link planted at a guessable
    name (the old ``.name.tmp-<pid>``) is neither written through nor replaced."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / f".out.tmp-{os.getpid()}").symlink_to(victim)
    with atomic_path(tmp_path / "out") as tmp:
        tmp.write_text("data")
    assert victim.read_text() == "keep" and (tmp_path / "out").read_text() == "data"


def test_a_long_name_and_a_private_mode(tmp_path: Path) -> None:
    target = tmp_path / ("n" * 250)
    with atomic_path(target, mode=0o600) as tmp:
        assert tmp.name.startswith(".tmp-"), "a name with room to spare"
        tmp.write_text("x")
    assert target.read_text() == "x" and target.stat().st_mode & 0o777 == 0o600


def test_a_fifo_swapped_in_for_the_temporary_file_is_refused_not_waited_on(
    tmp_path: Path,
) -> None:
    target = tmp_path / "out"
    with pytest.raises(OSError, match="not a regular file"), atomic_path(target) as tmp:
        tmp.unlink()
        os.mkfifo(tmp)
    assert not target.exists() and os.listdir(tmp_path) == []
