"""A large shard's parts stream in chunks read into reused buffers (ace3_worker.shard_ranges):
written at their offsets as they arrive, hashed in order, a part never more than CHUNKS_AHEAD
chunks ahead of the hash; a part that fails midway (the connection reset) fails the copy with
what it raised, and no reader thread outlives it. A ranged GET's body is read straight into
the buffers (S3ShardSource.open_range, BodyPart), its connection handed back once it is read
whole; a part of the wrong length or of another object never reaches the buffers."""

from __future__ import annotations

import hashlib
import io
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from ace3.config.shards import Shard
from ace3_worker import shard_ranges
from ace3_worker.shard_fetch import BodyPart, FetchStopped, S3ShardSource, ShardChangedError

CHUNK = 1024
PART = 4 * CHUNK
SIZE = 6 * PART - 100


@pytest.fixture(autouse=True)
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_ranges, "PART_BYTES", PART)
    monkeypatch.setattr(shard_ranges, "MIN_PART_BYTES", PART)
    monkeypatch.setattr(shard_ranges, "CHUNK_BYTES", CHUNK)
    monkeypatch.setattr(shard_ranges, "CHUNKS_AHEAD", 2)
    # (several parts in flight: the machinery a store far away is read with)
    monkeypatch.setattr(shard_ranges, "RANGE_READERS", 6)


def _copy(tmp_path: Path, data: bytes, open_part: shard_ranges.OpenPart) -> str:
    fd = os.open(tmp_path / "part", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        return shard_ranges.copy_ranges(
            open_part, Shard(name="big.bin", size=len(data), etag="e"), fd, threading.Event(),
            stopped=lambda: FetchStopped("big.bin"),
        )  # fmt: skip
    finally:
        os.close(fd)


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("shard-ranges")]


def test_later_parts_wait_within_their_chunks_ahead_and_all_land_hashed_in_order(
    tmp_path: Path,
) -> None:
    data = os.urandom(SIZE)
    first_may_go = threading.Event()
    reads: dict[int, int] = {}
    others_waiting = threading.Semaphore(0)

    class Counted(io.BytesIO):
        def __init__(self, first: int, last: int) -> None:
            super().__init__(data[first : last + 1])
            self.first = first

        def readinto(self, buffer: Any, /) -> int:
            if self.first == 0:
                first_may_go.wait(10)
            reads[self.first] = reads.get(self.first, 0) + 1
            if self.first and reads[self.first] == shard_ranges.CHUNKS_AHEAD:
                others_waiting.release()
            return super().readinto(buffer)

    def release_the_first() -> None:  # (part 0 goes once the others are held back)
        for _ in range(5):
            others_waiting.acquire(timeout=10)
        first_may_go.set()

    started = threading.Thread(target=release_the_first)
    started.start()
    digest = _copy(tmp_path, data, Counted)
    started.join()
    assert digest == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "part").read_bytes() == data
    assert sorted(reads) == [first for first, _ in shard_ranges.part_ranges(SIZE)]


def test_a_part_held_back_reads_no_more_than_chunks_ahead(tmp_path: Path) -> None:
    data = os.urandom(SIZE)
    first_may_go = threading.Event()
    ahead: list[int] = []

    class Watched(io.BytesIO):
        def __init__(self, first: int, last: int) -> None:
            super().__init__(data[first : last + 1])
            self.first, self.count = first, 0

        def readinto(self, buffer: Any, /) -> int:
            if self.first == 0:
                first_may_go.wait(10)
            elif not first_may_go.is_set():
                self.count += 1
                ahead.append(self.count)
                if self.count > shard_ranges.CHUNKS_AHEAD:
                    first_may_go.set()  # (held back too little: the assertion below says so)
            return super().readinto(buffer)

    timer = threading.Timer(0.5, first_may_go.set)  # (then part 0 goes in any case)
    timer.start()
    try:
        assert _copy(tmp_path, data, Watched) == hashlib.sha256(data).hexdigest()
    finally:
        timer.cancel()
    assert ahead and max(ahead) == shard_ranges.CHUNKS_AHEAD


def test_a_connection_reset_mid_part_fails_the_copy_and_ends_its_readers(tmp_path: Path) -> None:
    data = os.urandom(SIZE)

    class Resetting(io.BytesIO):
        def __init__(self, first: int, last: int) -> None:
            super().__init__(data[first : last + 1])
            self.first = first

        def readinto(self, buffer: Any, /) -> int:
            if self.first == 2 * PART and self.tell() >= CHUNK:
                raise ConnectionResetError("the source hung up")
            return super().readinto(buffer)

    with pytest.raises(ConnectionResetError, match="hung up"):
        _copy(tmp_path, data, Resetting)
    assert not _readers()
    with pytest.raises(OSError, match=rf"bytes {PART}-{2 * PART - 1} came as {CHUNK} bytes"):
        _copy(tmp_path, data, lambda first, last: io.BytesIO(
            data[first : first + CHUNK if first == PART else last + 1]))  # fmt: skip
    assert not _readers()


class _Connection:
    def __init__(self, data: bytes) -> None:
        self._fp = io.BytesIO(data)  # (http.client's response, as urllib3 holds it)
        self.released = 0

    def release_conn(self) -> None:
        self.released += 1


class _Body:
    def __init__(self, data: bytes, *, raw: bool = True) -> None:
        self._raw_stream = _Connection(data) if raw else None
        self.data, self.closed = io.BytesIO(data), False

    def read(self, count: int) -> bytes:
        return self.data.read(count)

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("raw", [True, False])
def test_a_body_is_read_into_the_buffers_and_its_connection_handed_back(raw: bool) -> None:
    data = os.urandom(3000)
    body = _Body(data, raw=raw)
    part, buffer, got = BodyPart(body, len(data)), memoryview(bytearray(1024)), b""
    while count := part.readinto(buffer):
        got += bytes(buffer[:count])
    assert got == data
    if raw:
        assert body._raw_stream is not None and body._raw_stream.released == 1
    part.close()
    assert body.closed


def test_open_range_refuses_a_part_of_the_wrong_length_or_of_another_object() -> None:
    shard = Shard(name="big.bin", size=1000, etag="e1")
    answers: list[dict[str, Any]] = []

    class Client:
        def get_object(self, **_: Any) -> dict[str, Any]:
            return answers.pop(0)

    source = S3ShardSource("s3://bucket/corpus/", Client())
    long, other = _Body(b"x" * 101), _Body(b"x" * 100)
    answers.append({"Body": long, "ETag": '"e1"', "ContentRange": "bytes 0-99/1000",
                    "ContentLength": 101})  # fmt: skip
    with pytest.raises(OSError, match=r"bytes 0-99 came as 101 bytes"):
        source.open_range(shard, 0, 99)
    answers.append({"Body": other, "ETag": '"e2"', "ContentRange": "bytes 0-99/1000",
                    "ContentLength": 100})  # fmt: skip
    with pytest.raises(ShardChangedError, match=r"its ETag is 'e2', registered 'e1'"):
        source.open_range(shard, 0, 99)
    assert long.closed and other.closed
