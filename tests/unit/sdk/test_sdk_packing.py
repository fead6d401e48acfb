"""Directory packing is deterministic and refuses links (but for a Hugging Face model
directory's links to files: the hub cache); hashing is chunked sha256."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import warnings
from pathlib import Path

import pytest

import ace3
from ace3.client._packing import pack_directory, pack_directory_bytes, pack_hf_model
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


def hub_snapshot(cache: Path) -> Path:
    """A hub cache as huggingface_hub lays it out: every file of snapshots/<revision>/ a link
    into ../../blobs/ (one level more for original/)."""
    files = {
        "config.json": b'{"model_type": "llama"}',
        "model.safetensors": b"weights",
        "tokenizer.json": b"{}",
        "pytorch_model.bin": b"pickle",
        "original/consolidated.00.pth": b"pickle",
        "original/params.json": b"{}",
    }
    (cache / "blobs").mkdir(parents=True)
    snapshot = cache / "snapshots" / "abc123"
    (snapshot / "original").mkdir(parents=True)
    for index, (name, content) in enumerate(files.items()):
        (cache / "blobs" / f"blob{index}").write_bytes(content)
        up = "../" * (name.count("/") + 2)
        (snapshot / name).symlink_to(f"{up}blobs/blob{index}")
    return snapshot


def test_a_hub_cache_snapshot_packs_its_files_without_pickled_weights(tmp_path: Path) -> None:
    snapshot = hub_snapshot(tmp_path / "cache")
    with pytest.warns(UserWarning, match=r"not packing 2 pickled weight file\(s\) \(original/"):
        members = pack_hf_model(snapshot, tmp_path / "model.tar.gz")
    assert members == ["config.json", "model.safetensors", "tokenizer.json"]
    with tarfile.open(tmp_path / "model.tar.gz") as archive:
        assert all(info.isfile() for info in archive.getmembers())
        weights = archive.extractfile("model.safetensors")
        assert weights is not None and weights.read() == b"weights"
    # the same bytes as a plain copy of what it holds: the same upload
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in members:
        shutil.copyfile(snapshot / name, copy / name)
    assert pack_hf_model(copy, tmp_path / "copy.tar.gz") == members
    assert (tmp_path / "copy.tar.gz").read_bytes() == (tmp_path / "model.tar.gz").read_bytes()
    # safetensors barely compress: gzip level 1 (XFL 4) here, packages keep level 9 (XFL 2)
    assert (tmp_path / "model.tar.gz").read_bytes()[8] == 4
    assert pack_directory_bytes(copy)[8] == 2


def test_pickled_weights_alone_are_packed_for_the_server_to_refuse(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        members = pack_hf_model(tmp_path, io.BytesIO())
    assert members == ["config.json", "pytorch_model.bin"]


def test_hf_links_to_directories_or_nothing_are_refused(tmp_path: Path) -> None:
    snapshot = hub_snapshot(tmp_path / "cache")
    (snapshot / "extra").symlink_to(tmp_path / "cache" / "blobs", target_is_directory=True)
    with pytest.raises(ace3.PackingError, match=r"extra: it is a symbolic link to .*not a regular"):
        pack_hf_model(snapshot, io.BytesIO())
    (snapshot / "extra").unlink()
    (snapshot / "extra").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ace3.PackingError, match=r"extra: .*which does not exist"):
        pack_hf_model(snapshot, io.BytesIO())
    with pytest.raises(ace3.PackingError, match="it is a symbolic link"):  # packages: still refused
        pack_directory(snapshot, io.BytesIO())
