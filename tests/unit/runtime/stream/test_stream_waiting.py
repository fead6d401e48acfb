"""A reader names the shards it needs in its request file (the worker's parser accepts it) and
waits for a shard that is not there yet; the log names the shard it waits for."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from ace3.config import TrainingConfig
from ace3.config.shards import parse_request, request_file_name
from ace3.runtime.data.stream import ShardStream, waiting
from tests.stream_shards import numbered_shards, sample_id


def test_a_reader_waits_for_its_shard_and_asks_for_the_next_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = numbered_shards(tmp_path / "shards", "parquet", [3, 2, 4, 1, 2])
    assert spec.stream is not None
    files = [s.file for s in spec.stream.shards]
    held = tmp_path / "held"
    held.mkdir()
    (tmp_path / "shards" / files[0]).rename(held / files[0])  # not fetched yet

    requests: list[list[str]] = []
    original_write = waiting.RequestFile.write

    def recording(self: waiting.RequestFile, need: list[str]) -> None:
        original_write(self, need)
        written = parse_request(self.path.read_bytes(), set(files)).need
        if not requests or requests[-1] != written:
            requests.append(written)

    monkeypatch.setattr(waiting.RequestFile, "write", recording)
    waiting_now = threading.Event()
    real_pause = waiting._pause

    def pause(seconds: float) -> None:
        waiting_now.set()
        real_pause(seconds)

    monkeypatch.setattr(waiting, "_pause", pause)
    request_path = Path(spec.stream.requests) / request_file_name("train", 1, 0)
    seen_while_waiting: list[list[str]] = []

    def worker() -> None:  # plays the ACE3 worker: reads the request, then links the shard in
        if waiting_now.wait(timeout=30):
            seen_while_waiting.append(parse_request(request_path.read_bytes(), set(files)).need)
        (held / files[0]).rename(tmp_path / "shards" / files[0])  # (also after a timeout)

    fetcher = threading.Thread(target=worker)
    fetcher.start()
    stream = ShardStream(
        spec,
        split="train",
        files=files,
        config=TrainingConfig(shuffle=False, epochs=1),
        rank=1,
        world_size=2,
        cycle=False,
    )
    read = [sample_id(s) for s in stream]
    fetcher.join(timeout=30)
    # dealt largest first: 000002 (4 samples) to reader 0, 000000 (3) to reader 1, 000001 (2)
    # to 1, 000004 (2) to 0, 000003 (1) to 1: reader 1 reads 000000, 000001, 000003
    assert stream.plan.share(0, 1) == [0, 1, 3]
    assert read == [0, 1, 2, 3, 4, 9]
    assert seen_while_waiting == [[files[0], files[1], files[3]]]
    assert requests == [
        [files[0], files[1], files[3]],
        [files[1], files[3]],
        [files[3]],
        [],
    ]


def test_a_long_wait_is_logged_with_the_shard_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = tmp_path / "000007.jsonl.zst"
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())
            shard.write_text("")  # it arrives once the wait was reported

    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        assert len(pauses) < 100, "the wait was never logged"

    handler = Collect()
    monkeypatch.setattr(waiting, "LOG_EVERY_S", 0.0)
    monkeypatch.setattr(waiting, "_pause", pause)
    level = waiting.ENGINE.level
    waiting.ENGINE.setLevel(logging.INFO)  # as ace3.runtime.observe.log sets it
    waiting.ENGINE.addHandler(handler)
    try:
        waiting.wait_for_file(shard, "train reader 3 of 4")
    finally:
        waiting.ENGINE.removeHandler(handler)
        waiting.ENGINE.setLevel(level)
    assert len(records) == 1
    assert "train reader 3 of 4: waiting" in records[0] and "000007.jsonl.zst" in records[0]


def test_present_shards_are_never_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_pause(seconds: float) -> None:
        raise AssertionError("waited for a shard that is there")

    monkeypatch.setattr(waiting, "_pause", no_pause)
    spec = numbered_shards(tmp_path / "shards", "tokens", [3, 3])
    assert spec.stream is not None
    files = [s.file for s in spec.stream.shards]
    config = TrainingConfig(sequence_length=2)
    stream = ShardStream(
        spec, split="validation", files=files, config=config, rank=0, world_size=1, cycle=False
    )
    assert sorted(sample_id(s) for s in stream) == list(range(6))
    request = Path(spec.stream.requests) / request_file_name("validation", 0, 0)
    assert parse_request(request.read_bytes(), set(files)).need == []
