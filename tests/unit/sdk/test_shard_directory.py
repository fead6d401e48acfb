"""Which files of a directory ``client.load_dataset(directory, format=...)`` uploads as shards,
under which names, and what it refuses before sending anything (the uploads themselves:
tests/integration/server/test_dataset_shards.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ace3
from ace3.client.shard_upload import find_shards, hash_shards


def _files(root: Path, names: list[str]) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(name.encode())
    return root


def test_the_shards_are_the_formats_files_at_any_depth_by_relative_path(tmp_path: Path) -> None:
    root = _files(
        tmp_path / "d",
        ["b/2.jsonl.gz", "a.jsonl", "b/1.jsonl", "c/3.jsonl.zst", "notes.txt", "x.parquet"],
    )
    found = find_shards(root, "jsonl")
    assert [name for name, _ in found] == ["a.jsonl", "b/1.jsonl", "b/2.jsonl.gz", "c/3.jsonl.zst"]
    assert all(path == root / name for name, path in found)
    [shard] = hash_shards(find_shards(root / "a.jsonl", "jsonl"))  # one file: one shard
    assert (shard.name, shard.size) == ("a.jsonl", len(b"a.jsonl"))


def test_what_cannot_be_a_shard_is_refused_before_any_upload(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"holds no parquet shards \(files ending in .parquet\)"):
        find_shards(_files(tmp_path / "e", ["a.jsonl"]), "parquet")
    with pytest.raises(ValueError, match=r"cannot upload .*my shard\.bin as a shard"):
        find_shards(_files(tmp_path / "s", ["my shard.bin"]), "tokens")


def test_dtype_and_columns_need_format(tmp_path: Path) -> None:
    with (
        ace3.Client(api_key="k", base_url="http://127.0.0.1:9") as client,
        pytest.raises(ValueError, match="go with format="),
    ):
        client.load_dataset(_files(tmp_path / "t", ["a.bin"]), dtype="uint16")
