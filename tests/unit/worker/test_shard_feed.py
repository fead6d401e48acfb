"""An attempt's shard feeder: the shards its readers ask for appear in the job's directory
(read-only, whole), those no request names any more go; two jobs of one dataset share the
node cache's entries (each shard fetched once); a changed shard or one larger than the cache
fails the attempt naming it, and never reaches the job. The job directory of a streamed
dataset: its job.json entry, its empty shard directories and the job's request directory."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import pytest

from ace3.config.shards import REQUEST_DIR, Shard, ShardManifest
from ace3.files import sha256_file
from ace3.runtime.job_spec import JobSpec
from ace3_control.storage import LocalArtifactStore
from ace3_worker.job_dir import JobDirectory, JobOwner, prepare_job_directory
from ace3_worker.shard_cache import ShardCache
from ace3_worker.shard_feed import ShardFeed
from ace3_worker.shard_fetch import ShardObject
from ace3_worker.shard_streams import Readers, ShardStream, stream_dataset

SIZE = 64


def content(name: str) -> bytes:
    return (name.encode() * SIZE)[:SIZE]


MANIFEST = ShardManifest(
    uri="s3://bucket/tokens/",
    format="tokens",
    dtype="uint16",
    shards=[Shard(name=f"train/{i:03d}.bin", size=SIZE, etag=f"e{i}") for i in range(4)],
)


class Source:
    uri = MANIFEST.uri

    def __init__(self, etags: dict[str, str] | None = None) -> None:
        self.etags = etags or {}
        self.opened: list[str] = []

    def open(self, shard: Shard) -> ShardObject:
        self.opened.append(shard.name)
        chunks: Iterator[bytes] = iter([content(shard.name)])
        return ShardObject(self.etags.get(shard.name, shard.etag), SIZE, chunks, lambda: None)


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Job:
    """A job directory with one streamed split and its running feeder."""

    def __init__(
        self, root: Path, cache: ShardCache, source: Source, readers: Readers | None = None
    ) -> None:
        self.output = root / "output"
        (self.output / REQUEST_DIR).mkdir(parents=True)
        _, self.stream = stream_dataset(
            "train", MANIFEST, root / "data" / "train", self.output / REQUEST_DIR, PurePosixPath
        )
        self.lines: list[str] = []
        self.failed = threading.Event()
        self.reasons: list[str] = []

        def fail(reason: str) -> None:
            self.reasons.append(reason)
            self.failed.set()

        streams: tuple[ShardStream, ...] = (self.stream,)
        self.feed = ShardFeed(
            streams,
            self.output,
            cache,
            lambda uri: source,
            log=self.lines.append,
            fail=fail,
            readers=readers,
        ).start()

    def request(self, *need: str, reader: str = "train-r0-w0.json") -> None:
        temporary = self.output / REQUEST_DIR / f".{reader}.tmp"
        temporary.write_text(json.dumps({"need": list(need)}))
        temporary.rename(self.output / REQUEST_DIR / reader)

    def present(self) -> set[str]:
        return {p.name for p in self.stream.directory.iterdir()}


@pytest.fixture
def cache(tmp_path: Path) -> ShardCache:
    return ShardCache(tmp_path / "cache", bound=10 * SIZE)


def test_shards_come_and_go_with_the_requests_and_two_jobs_share_them(
    tmp_path: Path, cache: ShardCache, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ace3_worker.shard_feed")
    source = Source()
    first = Job(tmp_path / "a", cache, source)
    second = Job(tmp_path / "b", cache, source)
    try:
        first.request("000000.bin", "000001.bin")
        wait_for(lambda: first.present() == {"000000.bin", "000001.bin"})
        shard = first.stream.directory / "000001.bin"
        assert shard.read_bytes() == content("train/001.bin")
        assert oct(shard.stat().st_mode & 0o777) == "0o444"
        first.request("000002.bin")
        wait_for(lambda: first.present() == {"000002.bin"})
        assert len(list(cache.root.glob("*/*.bin"))) == 3  # the cache keeps what a job left

        second.request("000002.bin", reader="train-r1-w0.json")
        wait_for(lambda: second.present() == {"000002.bin"})
        assert sorted(source.opened) == ["train/000.bin", "train/001.bin", "train/002.bin"]
        assert cache.path(first.stream.digest, "000002.bin").stat().st_nlink == 3
        digest = hashlib.sha256(content("train/002.bin")).hexdigest()
        said = f"ace3: dataset shard 'train/002.bin' ({SIZE} bytes): sha256 {digest}"
        assert said in first.lines and said in second.lines
        # whether another job of the node read it first: the worker's log alone, not the job's
        assert not any("source" in line or "cache" in line for line in first.lines + second.lines)
        assert "'train/002.bin' fetched from the source" in caplog.text
        assert "'train/002.bin' from this node's cache" in caplog.text
        sidecar = json.loads(
            Path(f"{cache.path(first.stream.digest, '000002.bin')}.sha256").read_text()
        )
        assert sidecar["sha256"] == digest and sidecar["name"] == "train/002.bin"
    finally:
        first.feed.stop()
        second.feed.stop()
    assert not first.failed.is_set() and len(list(cache.root.glob("*/*.bin"))) == 3


def test_a_changed_shard_fails_the_attempt_naming_it(tmp_path: Path, cache: ShardCache) -> None:
    job = Job(tmp_path / "a", cache, Source(etags={"train/003.bin": "e3-rewritten"}))
    try:
        job.request("000003.bin")
        assert job.failed.wait(10)
    finally:
        job.feed.stop()
    assert job.reasons == [
        "dataset shard 'train/003.bin' (s3://bucket/tokens/) changed since the dataset was "
        "registered: its ETag is 'e3-rewritten', registered 'e3'; register the dataset again to "
        "train on what it holds now"
    ]
    assert job.present() == set() and not list(cache.root.glob("*/*.bin"))


def test_a_shard_larger_than_the_cache_fails_the_attempt(tmp_path: Path) -> None:
    job = Job(tmp_path / "a", ShardCache(tmp_path / "cache", bound=SIZE - 1), Source())
    try:
        job.request("000001.bin")
        assert job.failed.wait(10)
    finally:
        job.feed.stop()
    assert "'train/001.bin'" in job.reasons[0]
    assert "ACE3_DATASET_CACHE_BYTES=63" in job.reasons[0]


def _row(**fields: object) -> SimpleNamespace:
    return SimpleNamespace(id="d", filename="d", entry_module=None, factory="build_model", **fields)


def test_a_streamed_dataset_gets_empty_shard_dirs_and_the_jobs_request_dir(
    tmp_path: Path,
) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    (tmp_path / "model.py").write_text("x = 1\n")
    store.put_file("models/o/m/model.py", tmp_path / "model.py")
    model = _row(
        kind="file", storage_key="models/o/m/model.py", sha256=sha256_file(tmp_path / "model.py")
    )
    remote = _row(
        kind="remote",
        manifest=MANIFEST.model_dump(mode="json"),
        storage_key="s3://x",
        sha256=MANIFEST.digest(),
    )
    job = SimpleNamespace(
        id="job1", config={}, model_kwargs={}, micro_batch_halvings=0, num_processes=1
    )
    owner = JobOwner(uid=54321, gid=54321, user_name="job")
    (tmp_path / "work").mkdir()

    def prepare(cache_bytes: int, attempt: int = 1) -> JobDirectory:
        return prepare_job_directory(
            tmp_path / "work", store, job, attempt, model, remote, remote, None,  # type: ignore[arg-type]  # rows as namespaces
            visible_root=PurePosixPath("/job"), owner=owner if os.geteuid() == 0 else None,
            dataset_cache_bytes=cache_bytes,
        )  # fmt: skip

    directory = prepare(2 * SIZE)  # (both splits' readers may read a shard at once)
    spec = JobSpec.model_validate_json(directory.job_file.read_text())
    for split, dataset in (("train", spec.dataset), ("validation", spec.validation_dataset)):
        assert dataset is not None and dataset.stream is not None
        assert dataset.path == f"/job/data/{split}/shards"
        assert dataset.stream.requests == "/job/output/shard-requests"
        assert [s.file for s in dataset.stream.shards][:2] == ["000000.bin", "000001.bin"]
        shards = directory.root / "data" / split / "shards"
        assert list(shards.iterdir()) == [] and oct(shards.stat().st_mode & 0o777) == "0o755"
    assert [s.split for s in directory.streams] == ["train", "validation"]
    requests = directory.output_dir / REQUEST_DIR
    if os.geteuid() == 0:
        assert (requests.stat().st_uid, oct(requests.stat().st_mode & 0o777)) == (54321, "0o700")
    with pytest.raises(ValueError, match=r"'train/000.bin' is 64 bytes.*CACHE_BYTES=63"):
        prepare(SIZE - 1, attempt=2)
