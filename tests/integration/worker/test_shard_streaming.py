"""Streaming a registered dataset's shards from a real S3 server (SeaweedFS) into a running
attempt: the bytes fetched are hashed, the sha256 recorded beside the cache entry and in the
job's log; a shard whose object changed after registration (another ETag) stops the attempt,
and the job fails naming the shard, without a retry and without the shard reaching the job; a
deleted one likewise. An uploaded shard directory (kind "shards") streams from the worker's
artifact store the same way, each shard checked against its sha256."""

from __future__ import annotations

import hashlib
import io
import json
import queue
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any

import pytest

from ace3.config.shards import REQUEST_DIR, Shard, ShardManifest
from ace3_control.models import Job, JobState
from ace3_control.settings import Settings
from ace3_control.source_client import source_client
from ace3_control.storage import open_store
from ace3_server.migrations_check import upgrade
from ace3_worker import reports
from ace3_worker.attempt_run import AttemptRunner
from ace3_worker.job_dir import JobDirectory
from ace3_worker.launch import RunningTorchrun
from ace3_worker.log_limits import LogLimiter
from ace3_worker.sandbox.launch import SandboxedProcess
from ace3_worker.sandbox.plan import SandboxPlan
from ace3_worker.shard_feed import ShardFeed
from ace3_worker.shard_streams import stream_dataset
from ace3_worker.supervisor import Supervisor
from ace3_worker.watch import AttemptWatch
from tests.conftest import insert_job
from tests.object_store import ObjectStore

SHARD_BYTES = 3000


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def bucket(
    object_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> SimpleNamespace:
    """Three token shards under s3://<new bucket>/corpus/, registered (their manifest)."""
    for name, value in object_store.env("unused").items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    (tmp_path / "data").mkdir()
    settings = Settings(
        data_dir=tmp_path / "data",
        s3_endpoint_url=object_store.endpoint_url,
        dataset_cache_bytes=10 * SHARD_BYTES,
        lease_seconds=30,
    )
    client = source_client(settings)
    name = f"shards-{secrets.token_hex(5)}"
    client.create_bucket(Bucket=name)
    for i in range(3):
        client.put_object(
            Bucket=name, Key=f"corpus/train/{i:03d}.bin", Body=bytes([i]) * SHARD_BYTES
        )
    listed = client.list_objects_v2(Bucket=name, Prefix="corpus/")["Contents"]
    manifest = ShardManifest(
        uri=f"s3://{name}/corpus/",
        format="tokens",
        dtype="uint16",
        shards=[
            Shard(name=o["Key"].removeprefix("corpus/"), size=o["Size"], etag=o["ETag"].strip('"'))
            for o in listed
        ],
    )
    return SimpleNamespace(settings=settings, client=client, name=name, manifest=manifest)


def _directory(root: Path, manifest: ShardManifest, kind: str = "remote") -> JobDirectory:
    directory = JobDirectory(root, PurePosixPath(root))
    (directory.output_dir / REQUEST_DIR).mkdir(parents=True)
    _, stream = stream_dataset(
        "train",
        manifest,
        root / "data" / "train",
        directory.output_dir / REQUEST_DIR,
        PurePosixPath,
        kind=kind,
    )
    directory.streams = (stream,)
    return directory


def _request(directory: JobDirectory, *need: str) -> None:
    temporary = directory.output_dir / REQUEST_DIR / ".train-r0-w0.json.tmp"
    temporary.write_text(json.dumps({"need": list(need)}))
    temporary.rename(directory.output_dir / REQUEST_DIR / "train-r0-w0.json")


def test_fetched_shards_are_hashed_and_a_changed_one_fails_the_job(
    bucket: SimpleNamespace, tmp_path: Path
) -> None:
    settings = bucket.settings
    upgrade(settings.resolved_database_url)
    supervisor = Supervisor(settings)
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=1, state="running", max_retries=3)
        session.expunge(job)
    directory = _directory(tmp_path / "attempt", bucket.manifest)
    plan = SandboxPlan(mode="none", dedicated_uids=False, runtime_paths=(), hidden=())
    process = SandboxedProcess(
        subprocess.Popen(["sleep", "60"], start_new_session=True), plan, None
    )
    lines: queue.Queue[reports.LogLine] = queue.Queue()
    running = RunningTorchrun(process, lines, LogLimiter(100, 1e6, 10**6), [], threading.Event())
    watch = AttemptWatch(job.id, 1)
    runner = AttemptRunner(settings, None, None, None, None, None)  # type: ignore[arg-type]  # _feed uses settings only
    feed = runner._feed(job, directory, watch, running)  # what the attempt runs beside its watch
    assert feed is not None
    shards = directory.streams[0].directory
    try:
        _request(directory, "000000.bin")
        wait_for(lambda: (shards / "000000.bin").exists())
        digest = hashlib.sha256(bytes([0]) * SHARD_BYTES).hexdigest()
        sidecar = Path(f"{feed.cache.path(directory.streams[0].digest, '000000.bin')}.sha256")
        assert json.loads(sidecar.read_text())["sha256"] == digest
        said = [lines.get_nowait() for _ in range(lines.qsize())]
        assert [line.stream for line in said] == ["service"]
        assert f"'train/000.bin' ({SHARD_BYTES} bytes): sha256 {digest}" in said[0].line

        # The object is rewritten after registration (same size, other bytes: another ETag).
        bucket.client.put_object(
            Bucket=bucket.name, Key="corpus/train/001.bin", Body=b"\xff" * SHARD_BYTES
        )
        _request(directory, "000001.bin")
        returncode = process.wait(timeout=20)  # the feeder stopped the attempt
    finally:
        feed.stop()
        process.kill()
        process.wait()
    assert returncode == -signal.SIGTERM and not (shards / "000001.bin").exists()
    supervisor.outcomes.record_attempt(
        job, watch, returncode, reports.EventTail(directory.output_dir)
    )
    with supervisor.sessions() as session:
        row: Any = session.get(Job, job.id)
        assert (row.state, row.attempt) == (JobState.FAILED, 1), "failed, not retried"
        assert row.error.startswith("training stopped: dataset shard 'train/001.bin'")
        # (read If-Match the registered ETag: the store refused the other object, 412)
        assert f"its ETag is no longer {bucket.manifest.shards[1].etag!r}" in row.error
        assert "register the dataset again" in row.error


def test_a_deleted_shard_fails_the_attempt_naming_it(
    bucket: SimpleNamespace, tmp_path: Path
) -> None:
    bucket.client.delete_object(Bucket=bucket.name, Key="corpus/train/002.bin")
    directory = _directory(tmp_path / "attempt", bucket.manifest)
    reasons: list[str] = []
    failed = threading.Event()

    def fail(reason: str) -> None:
        reasons.append(reason)
        failed.set()

    feed = ShardFeed.for_attempt(
        bucket.settings, directory.streams, directory.output_dir, log=print, fail=fail
    ).start()
    try:
        _request(directory, "000002.bin")
        assert failed.wait(20)
    finally:
        feed.stop()
    assert reasons == [
        f"dataset shard 'train/002.bin' is gone from s3://{bucket.name}/corpus/ (deleted since "
        "the dataset was registered)"
    ]


def test_an_uploaded_shard_directory_streams_from_the_store_and_a_corrupted_shard_fails(
    tmp_path: Path,
) -> None:
    """Kind "shards" on the local store the worker opens from its settings."""
    (tmp_path / "data").mkdir()
    settings = Settings(
        data_dir=tmp_path / "data", dataset_cache_bytes=10 * SHARD_BYTES, lease_seconds=30
    )
    upgrade(settings.resolved_database_url)
    store = open_store(settings)
    contents = [bytes([i]) * SHARD_BYTES for i in range(2)]
    digests = [hashlib.sha256(data).hexdigest() for data in contents]
    for data, digest in zip(contents, digests, strict=True):
        store.put_stream(f"datasets/o/shards/{digest}", io.BytesIO(data), sha256=digest)
    manifest = ShardManifest(
        uri="datasets/o/shards/",
        format="tokens",
        dtype="uint16",
        shards=[
            Shard(name=f"train/{i}.bin", size=SHARD_BYTES, etag=d) for i, d in enumerate(digests)
        ],
    )
    supervisor = Supervisor(settings)
    with supervisor.sessions() as session:
        job = insert_job(session, attempt=1, state="running", max_retries=3)
        session.expunge(job)
    directory = _directory(tmp_path / "attempt", manifest, kind="shards")
    plan = SandboxPlan(mode="none", dedicated_uids=False, runtime_paths=(), hidden=())
    process = SandboxedProcess(
        subprocess.Popen(["sleep", "60"], start_new_session=True), plan, None
    )
    lines: queue.Queue[reports.LogLine] = queue.Queue()
    running = RunningTorchrun(process, lines, LogLimiter(100, 1e6, 10**6), [], threading.Event())
    watch = AttemptWatch(job.id, 1)
    runner = AttemptRunner(settings, None, None, None, None, None)  # type: ignore[arg-type]  # _feed uses settings only
    feed = runner._feed(job, directory, watch, running)
    assert feed is not None
    shards = directory.streams[0].directory
    try:
        _request(directory, "000000.bin")
        wait_for(lambda: (shards / "000000.bin").exists())
        assert (shards / "000000.bin").read_bytes() == contents[0]
        said = lines.get_nowait().line
        assert f"'train/0.bin' ({SHARD_BYTES} bytes): sha256 " in said
        assert said.endswith(digests[0])

        # The stored object's bytes change under the store (same size: only the sha256 tells).
        key = f"datasets/o/shards/{digests[1]}"
        damaged = b"\xff" * SHARD_BYTES
        (settings.resolved_storage_dir / key).write_bytes(damaged)
        _request(directory, "000001.bin")
        returncode = process.wait(timeout=20)
    finally:
        feed.stop()
        process.kill()
        process.wait()
    assert returncode == -signal.SIGTERM and not (shards / "000001.bin").exists()
    supervisor.outcomes.record_attempt(
        job, watch, returncode, reports.EventTail(directory.output_dir)
    )
    with supervisor.sessions() as session:
        row: Any = session.get(Job, job.id)
        assert (row.state, row.attempt) == (JobState.FAILED, 1), "failed, not retried"
        assert row.error.startswith(
            f"training stopped: dataset shard 'train/1.bin' ({key}) is not what was uploaded: "
            f"its sha256 is {hashlib.sha256(damaged).hexdigest()}"
        )
