"""What one attempt may ask of the node cache: only its readers' request files are read
(the names its ranks, num_workers and streamed splits give), each cut to its current shard and
the look-ahead, look-ahead shards only within the attempt's share (copies too), a job whose
readers' current shards cannot fit in its share refused when prepared; a request for a split
not streamed is reported once, a failing pass logged at most once a minute; stop() returns only
when no fetch can link a shard any more."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from ace3.config.shards import REQUEST_DIR, Shard
from ace3_worker.shard_cache import ShardCache
from ace3_worker.shard_feed import ShardFeed
from ace3_worker.shard_fetch import ShardObject
from ace3_worker.shard_requests import MAX_NAMES
from ace3_worker.shard_streams import Readers, plan_readers, stream_dataset
from tests.unit.worker.test_shard_feed import MANIFEST, SIZE, Job, Source, content, wait_for


def readers(names: set[str], share: int, current: int) -> Readers:
    return Readers(frozenset(names), current, share)


def test_only_the_readers_requests_are_read_each_cut_to_the_look_ahead(tmp_path: Path) -> None:
    names = {"train-r0-w0.json", "train-r0-w1.json"}
    job = Job(
        tmp_path / "a", ShardCache(tmp_path / "cache", 10 * SIZE), Source(),
        readers(names, share=10 * SIZE, current=2 * SIZE),
    )  # fmt: skip
    try:
        job.request("000000.bin", reader="train-r7-w0.json")  # no reader of this attempt's
        job.request(*(f"{i:06d}.bin" for i in range(4)), "000000.bin", reader="train-r0-w1.json")
        wait_for(lambda: job.present() == {f"{i:06d}.bin" for i in range(MAX_NAMES)})
        job.request("000001.bin", reader="train-r0-w0.json")
        wait_for(lambda: any("train-r7-w0.json" in line for line in job.lines))
    finally:
        job.feed.stop()
    said = [line for line in job.lines if "ignored shard request" in line]
    assert len(said) == 2 and "no reader of this attempt" in said[0] + said[1]
    assert any(f"only its first {MAX_NAMES}" in line for line in said)


def test_look_ahead_stays_within_the_attempts_share_copies_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_link(*_: object, **__: object) -> None:  # the work directory on another filesystem
        raise OSError(errno.EXDEV, "cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    source = Source()
    job = Job(
        tmp_path / "a", ShardCache(tmp_path / "cache", 10 * SIZE), source,
        readers({"train-r0-w0.json"}, share=2 * SIZE, current=SIZE),
    )  # fmt: skip
    try:
        job.request("000000.bin", "000001.bin", "000002.bin")
        wait_for(lambda: job.present() == {"000000.bin", "000001.bin"})
        job.request("000003.bin", "000000.bin")  # the reader moved on
        wait_for(lambda: job.present() == {"000003.bin", "000000.bin"})
        assert (job.stream.directory / "000003.bin").read_bytes() == content("train/003.bin")
    finally:
        job.feed.stop()
    assert not job.failed.is_set()
    # (the second look-ahead, past the share less the SIZE kept for the current shard: never)
    assert sorted(source.opened) == ["train/000.bin", "train/001.bin", "train/003.bin"]


def test_a_job_whose_readers_current_shards_cannot_fit_its_share_is_refused(
    tmp_path: Path,
) -> None:
    _, stream = stream_dataset("train", MANIFEST, tmp_path / "t", tmp_path / "r", PurePosixPath)
    config = {"num_workers": 2, "num_gpus": 2, "validation_split": 0}
    plan = plan_readers(
        config, 2, None, (stream,), validation_given=False, cache_bytes=8 * SIZE, slots=2
    )
    assert plan.names == {f"train-r{r}-w{w}.json" for r in (0, 1) for w in (0, 1)}
    assert (plan.current_bytes, plan.share) == (4 * SIZE, 4 * SIZE)
    gang = plan_readers(
        {"num_gpus": 2, "num_nodes": 2},
        4,
        1,
        (stream,),
        validation_given=False,
        cache_bytes=8 * SIZE,
        slots=1,
    )  # fmt: skip  (node 1 of 2: ranks 2 and 3; validation held out of the train shards)
    assert gang.names == {f"{s}-r{r}-w0.json" for s in ("train", "validation") for r in (2, 3)}
    tensor = plan_readers(
        {"num_gpus": 4, "tensor_parallel_size": 2, "validation_split": 0}, 4, None, (stream,),
        validation_given=False, cache_bytes=8 * SIZE, slots=1,
    )  # fmt: skip
    assert tensor.names == {"train-r0-w0.json", "train-r1-w0.json"}  # (two replicas)
    with pytest.raises(ValueError) as refused:
        plan_readers(
            config, 2, None, (stream,), validation_given=False, cache_bytes=8 * SIZE, slots=3
        )
    for said in ("num_workers=2", "2 data-parallel rank", f"ACE3_DATASET_CACHE_BYTES={8 * SIZE}"):
        assert said in str(refused.value)


def test_a_request_for_a_split_not_streamed_is_reported_once_and_passes_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    output = tmp_path / "output"
    (output / REQUEST_DIR).mkdir(parents=True)
    _, stream = stream_dataset(
        "validation", MANIFEST, tmp_path / "data" / "validation", output / REQUEST_DIR,
        PurePosixPath,
    )  # fmt: skip
    lines: list[str] = []
    source = Source()
    feed = ShardFeed(
        (stream,), output, ShardCache(tmp_path / "cache", 10 * SIZE), lambda s: source,
        log=lines.append, fail=lines.append,
    ).start()  # fmt: skip
    try:
        (output / REQUEST_DIR / "train-r0-w0.json").write_text('{"need": []}')
        (output / REQUEST_DIR / "validation-r0-w0.json").write_text('{"need": ["000001.bin"]}')
        wait_for(lambda: (stream.directory / "000001.bin").exists())
        feed.wake.set()
    finally:
        feed.stop()
    assert [line for line in lines if "train-r0-w0.json" in line] == [
        "ace3: ignored shard request 'train-r0-w0.json': the job does not stream a train split"
    ]
    assert "pass failed" not in caplog.text


def test_a_failing_pass_is_logged_at_most_once_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    job = Job(tmp_path / "a", ShardCache(tmp_path / "cache", 10 * SIZE), Source())
    passes = threading.Semaphore(0)

    def broken() -> list[object]:
        passes.release()
        raise RuntimeError("broken pass")

    job.feed.requests.read = broken  # type: ignore[method-assign]
    try:
        for _ in range(5):
            job.feed.wake.set()
            assert passes.acquire(timeout=10)
    finally:
        job.feed.stop()
    failed = [r for r in caplog.records if "pass failed" in r.getMessage()]
    assert len(failed) == 1


class BlockingSource:
    """A source whose fetch waits for ``release`` once it began."""

    uri = MANIFEST.uri

    def __init__(self) -> None:
        self.began = threading.Event()
        self.release = threading.Event()

    def open(self, shard: Shard) -> ShardObject:
        self.began.set()
        self.release.wait(10)
        chunks: Iterator[bytes] = iter([content(shard.name)])
        return ShardObject(shard.etag, SIZE, chunks, lambda: None)


def test_stop_returns_once_no_fetch_can_link_a_shard(tmp_path: Path) -> None:
    source = BlockingSource()
    job = Job(tmp_path / "a", ShardCache(tmp_path / "cache", 10 * SIZE), source)  # type: ignore[arg-type]
    job.request("000000.bin")
    assert source.began.wait(10)
    stopped = threading.Thread(target=job.feed.stop)
    stopped.start()
    stopped.join(0.3)
    assert stopped.is_alive()  # (waits for the fetch under way)
    source.release.set()
    stopped.join(10)
    assert not stopped.is_alive() and job.present() == set()
