"""A large shard of a bucket is fetched as parallel ranged GETs (ace3_worker.shard_ranges): the
parts land at their offsets and are hashed in order whatever order they arrive in; every part
is read If-Match the registered ETag, so an object rewritten (or deleted) after registration
fails the fetch naming the shard, and a part that comes short fails it too. Against the
session's SeaweedFS, with the part size made tiny (a few 64 KiB parts)."""

from __future__ import annotations

import hashlib
import io
import os
import random
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ace3.config.shards import Shard
from ace3_control.dataset_sources import list_manifest
from ace3_control.settings import Settings
from ace3_control.source_client import source_client
from ace3_worker import shard_ranges
from ace3_worker.shard_cache import ShardCache
from ace3_worker.shard_fetch import FetchStopped, S3ShardSource, ShardChangedError, obtain
from tests.object_store import ObjectStore
from tests.shard_sources import source_credentials

PART = 64 * 1024
SIZE = 5 * PART + 124  # six parts, the last one short


@pytest.fixture(autouse=True)
def tiny_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_ranges, "PART_BYTES", PART)
    monkeypatch.setattr(shard_ranges, "MIN_PART_BYTES", PART)
    monkeypatch.setattr(shard_ranges, "RANGED_MIN_BYTES", 2 * PART)
    monkeypatch.setattr(shard_ranges, "CHUNK_BYTES", PART // 4)
    # (several parts in flight: the machinery a store far away is read with)
    monkeypatch.setattr(shard_ranges, "RANGE_READERS", 6)


def _shard(data: bytes) -> Shard:
    return Shard(name="big.bin", size=len(data), etag="e")


def test_parts_arrive_in_any_order_and_are_written_and_hashed_in_place(tmp_path: Path) -> None:
    data = os.urandom(SIZE)
    asked: list[tuple[int, int]] = []

    def read_part(first: int, last: int) -> io.BytesIO:
        asked.append((first, last))
        time.sleep(random.random() / 100)  # (parts finish out of order)
        return io.BytesIO(data[first : last + 1])

    fd = os.open(tmp_path / "part", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        digest = shard_ranges.copy_ranges(
            read_part, _shard(data), fd, threading.Event(), stopped=lambda: FetchStopped("x")
        )
    finally:
        os.close(fd)
    assert digest == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "part").read_bytes() == data
    assert sorted(asked) == shard_ranges.part_ranges(SIZE) and len(asked) == 6


def test_a_short_part_or_a_stop_ends_the_copy(tmp_path: Path) -> None:
    data = os.urandom(SIZE)
    fd = os.open(tmp_path / "part", os.O_WRONLY | os.O_CREAT, 0o600)
    stop = threading.Event()
    try:
        with pytest.raises(OSError, match=r"bytes 131072-196607 came as 10 bytes"):
            shard_ranges.copy_ranges(
                lambda first, last: io.BytesIO(
                    data[first : first + 10 if first == 2 * PART else last + 1]
                ),
                _shard(data), fd, stop, stopped=lambda: FetchStopped("x"),
            )  # fmt: skip

        def stopping(first: int, last: int) -> io.BytesIO:
            stop.set()
            return io.BytesIO(data[first : last + 1])

        with pytest.raises(FetchStopped):
            shard_ranges.copy_ranges(
                stopping, _shard(data), fd, stop, stopped=lambda: FetchStopped("x")
            )
    finally:
        os.close(fd)


@pytest.fixture
def bucket(object_store: ObjectStore, tmp_path: Path) -> Any:
    with source_credentials(object_store):
        settings = Settings(data_dir=tmp_path, s3_endpoint_url=object_store.endpoint_url)
        client = source_client(settings)
        name = f"ranges-{secrets.token_hex(4)}"
        client.create_bucket(Bucket=name)
        yield client, name


def test_a_large_shard_is_fetched_in_ranges_and_a_rewritten_one_fails(
    bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, name = bucket
    data = {f"{i}.bin": os.urandom(SIZE + i * 2) for i in range(3)}
    for key, body in data.items():
        client.put_object(Bucket=name, Key=f"corpus/{key}", Body=body)
    manifest = list_manifest(client, f"s3://{name}/corpus/", "tokens")
    source = S3ShardSource(manifest.uri, client)
    ranges: list[str] = []
    real_get = source._get
    monkeypatch.setattr(source, "_get", lambda shard, **extra: (
        ranges.append(extra.get("Range", "whole")), real_get(shard, **extra))[1])  # fmt: skip
    cache, stop = ShardCache(tmp_path / "cache", 1 << 30), threading.Event()

    def fetch(index: int) -> Any:
        shard = manifest.shards[index]
        return obtain(cache, source, manifest.digest(), f"{index:06d}.bin", shard, stop=stop,
                      wait=True)  # fmt: skip

    got = fetch(0)
    assert got is not None and got.fetched
    assert got.cached.path.read_bytes() == data["0.bin"]
    assert got.cached.sha256 == hashlib.sha256(data["0.bin"]).hexdigest()
    assert len(ranges) == 6 and "whole" not in ranges and "bytes=0-65535" in ranges

    # Rewritten after registration (same size, other bytes), and deleted: every range is
    # If-Match the registered ETag, so neither reaches the cache.
    client.put_object(Bucket=name, Key="corpus/1.bin", Body=os.urandom(len(data["1.bin"])))
    with pytest.raises(ShardChangedError, match=r"shard '1.bin' .* changed since the dataset"):
        fetch(1)
    client.delete_object(Bucket=name, Key="corpus/2.bin")
    with pytest.raises(ShardChangedError, match=r"shard '2.bin' is gone"):
        fetch(2)
    assert cache.lookup(manifest.digest(), "000001.bin") is None
    assert sorted(p.name for p in (tmp_path / "cache" / manifest.digest()).iterdir()
                  if not p.name.startswith(".")) == ["000000.bin", "000000.bin.sha256"]  # fmt: skip


def test_read_ahead_gives_every_chunk_in_order_and_what_reading_raised() -> None:
    closed = threading.Event()
    chunks = [bytes([i]) * 10 for i in range(50)]
    assert list(shard_ranges.read_ahead(iter(chunks), closed)) == chunks

    def failing() -> Any:
        yield b"first"
        raise ConnectionResetError("the source hung up")

    read = shard_ranges.read_ahead(failing(), closed)
    assert next(read) == b"first"
    with pytest.raises(ConnectionResetError, match="hung up"):
        next(read)

    reading = threading.Event()

    def endless() -> Any:
        while True:
            reading.set()
            yield b"x"

    read = shard_ranges.read_ahead(endless(), closed)
    next(read)  # (the reader fills the queue and waits for room)
    closed.set()  # the caller is done: the reader stops instead of waiting on
    threads = [t for t in threading.enumerate() if t.name == "shard-read-ahead"]
    for thread in threads:
        thread.join(timeout=2)
    assert not any(thread.is_alive() for thread in threads)
