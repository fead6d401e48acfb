"""Directory packing is deterministic and refuses links; hashing is chunked sha256."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

import ace3
from ace3.client._packing import pack_directory, pack_directory_bytes
from ace3.files import sha256_file


def make_tree(root: Path) -> Path:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("def build_model():\n    return None\n")
    (root / "pkg" / "sub" / "data.txt").write_text("x" * 1000)
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    return root / "pkg"


def test_packing_is_deterministic_regardless_of_mtimes(tmp_path: Path):
    package = make_tree(tmp_path / "a")
    first = pack_directory_bytes(package)
    for path in package.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    second = pack_directory_bytes(package)
    assert first == second
    other = make_tree(tmp_path / "b")  # same contents elsewhere, created later
    assert pack_directory_bytes(other) == first


def test_archive_entries_are_sorted_normalised_and_skip_caches(tmp_path: Path):
    package = make_tree(tmp_path)
    members = pack_directory(package, tmp_path / "out.tar.gz", prefix="pkg")
    assert members == ["pkg", "pkg/__init__.py", "pkg/model.py", "pkg/sub", "pkg/sub/data.txt"]
    with tarfile.open(tmp_path / "out.tar.gz") as archive:
        infos = archive.getmembers()
        assert [info.name for info in infos] == members
        assert {(info.mtime, info.uid, info.gid, info.uname) for info in infos} == {(0, 0, 0, "")}
        assert archive.extractfile("pkg/sub/data.txt").read() == b"x" * 1000


def test_symlink_is_refused_with_a_clear_error(tmp_path: Path):
    package = make_tree(tmp_path)
    (package / "link.py").symlink_to(package / "model.py")
    with pytest.raises(ace3.PackingError, match=r"link\.py: it is a symbolic link"):
        pack_directory(package, io.BytesIO())
    assert isinstance(ace3.PackingError("x"), ValueError)


def test_sha256_file_reads_in_chunks(tmp_path: Path):
    path = tmp_path / "blob"
    data = os.urandom(3 * 1024 + 7)
    path.write_bytes(data)
    assert sha256_file(path, chunk_size=1024) == hashlib.sha256(data).hexdigest()
