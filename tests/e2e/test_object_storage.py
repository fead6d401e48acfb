"""The API and a worker that share nothing but the database, the broker and an S3 bucket (a real
SeaweedFS): separate data directories, no shared storage directory. A job's model and data
reach the worker through the bucket, its checkpoint comes back through it, and a download is
a 307 to a presigned URL that the SDK follows (without the API key). A two-node job runs on two
such workers, which share no directory either: a ZeRO-3 job, whose sharded checkpoint gets
node 1's shards over the process group, packed on rank 0 and uploaded through the bucket."""

from __future__ import annotations

import hashlib
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from sqlalchemy import select

import ace3
from ace3_control.db import make_sync_engine
from ace3_control.models import JobNode
from tests.conftest import (
    DigitsFiles,
    Stack,
    _stop,
    free_port,
    fresh_database,
    load_example,
    stack_env,
)
from tests.e2e.conftest import wait_for
from tests.object_store import ObjectStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3_stack(
    redis_url: str, object_store: ObjectStore, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, Stack, str]]:
    """(the API, the worker, the bucket): each with a data directory of its own."""
    bucket = f"ace3-e2e-{secrets.token_hex(4)}"
    with fresh_database() as database_url:
        stacks = []
        for name in ("s3-api", "s3-worker"):
            root = tmp_path_factory.mktemp(name)
            env = stack_env(root, database_url, redis_url) | object_store.env(bucket)
            env["ACE3_S3_PRESIGNED_DOWNLOADS"] = "true"
            port = free_port()
            stacks.append(Stack(f"http://127.0.0.1:{port}", port, env, root))
        api, worker = stacks
        worker.env["ACE3_QUEUE_NAME"] = api.env["ACE3_QUEUE_NAME"]
        worker.env["ACE3_WORKER_ADVERTISE_HOST"] = "127.0.0.1"
        worker.start_worker()
        try:
            api.start_api()
            yield api, worker, bucket
        finally:
            for stack in stacks:
                for process in stack.processes.values():
                    _stop(process)
            shutil.rmtree(worker.root / "jobs", ignore_errors=True)


def test_a_job_runs_with_its_files_in_the_object_store_only(
    s3_stack: tuple[Stack, Stack, str],
    object_store: ObjectStore,
    digits_files: DigitsFiles,
    tmp_path: Path,
) -> None:
    api, worker, bucket = s3_stack
    key, _ = api.create_key("s3-e2e")
    with ace3.Client(api_key=key, base_url=api.base_url) as client:
        model = client.load_model(digits_files.model)
        train = client.load_dataset(digits_files.train)
        config = ace3.TrainingConfig(num_gpus=1, batch_size=128, epochs=1, max_steps=4, seed=0)
        job = client.jobs.create(model_id=model.id, dataset_id=train.id, config=config)
        deadline = time.monotonic() + 180
        while not (job := client.jobs.retrieve(job.id)).is_terminal:
            assert time.monotonic() < deadline, "the job did not finish"
            time.sleep(0.5)
        assert job.state == "succeeded", f"{job.error}\n{worker.log_tail('worker')}"
        checkpoint = client.jobs.checkpoints(job.id)[-1]
        downloaded = client.jobs.download_checkpoint(job.id, checkpoint, tmp_path)

    assert hashlib.sha256(downloaded.read_bytes()).hexdigest() == checkpoint.sha256
    raw = httpx.get(
        f"{api.base_url}/v1/jobs/{job.id}/checkpoints/{checkpoint.id}/content",
        headers={"authorization": f"Bearer {key}"},
    )
    assert raw.status_code == 307 and raw.headers["x-checksum-sha256"] == checkpoint.sha256
    assert raw.headers["location"].startswith(object_store.endpoint_url)

    s3 = boto3.client(
        "s3",
        endpoint_url=object_store.endpoint_url,
        aws_access_key_id=object_store.access_key,
        aws_secret_access_key=object_store.secret_key,
        region_name="us-east-1",
    )
    names = {item["Key"] for item in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert {name.split("/")[1] for name in names} >= {"models", "datasets", "checkpoints"}
    assert all(name.startswith("ace3/") for name in names)
    for stack in (api, worker):  # nothing but (empty) staging on either machine's disk
        storage = stack.root / "storage"
        leftovers = [p for p in storage.rglob("*") if p.is_file()] if storage.exists() else []
        assert leftovers == [], leftovers


@pytest.fixture(scope="module")
def second_s3_worker(
    s3_stack: tuple[Stack, Stack, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Another worker on the same database, broker and bucket, with a data directory of its own."""
    _, first, _ = s3_stack
    root = tmp_path_factory.mktemp("s3-worker2")
    # (it runs a node of a multi-node job, which starts cold: nothing to prepare)
    env = {
        **first.env,
        "ACE3_DATA_DIR": str(root),
        "ACE3_WORKER_SLOTS": "1",
        "ACE3_WARM_LAUNCH": "false",
    }
    second = Stack(first.base_url, first.port, env, root)
    second.start_worker()
    try:
        yield second
    finally:
        for process in second.processes.values():
            _stop(process)
        shutil.rmtree(root / "jobs", ignore_errors=True)


def test_a_two_node_zero_job_runs_on_workers_that_share_no_directory(
    s3_stack: tuple[Stack, Stack, str],
    second_s3_worker: Stack,
    digits_files: DigitsFiles,
    tmp_path: Path,
) -> None:
    api, worker, _ = s3_stack
    key, _ = api.create_key("s3-multi-node")
    with ace3.Client(api_key=key, base_url=api.base_url) as client:
        wait_for(lambda: len(client.workers.list()) >= 2, 60, "both workers to register")
        model = client.load_model(digits_files.model)
        train = client.load_dataset(digits_files.train)
        config = ace3.TrainingConfig(
            num_gpus=1, num_nodes=2, zero_stage=3, batch_size=128, epochs=1, max_steps=4, seed=0
        )
        job = client.jobs.create(model_id=model.id, dataset_id=train.id, config=config)
        deadline = time.monotonic() + 240
        while not (job := client.jobs.retrieve(job.id)).is_terminal:
            assert time.monotonic() < deadline, "the job did not finish"
            time.sleep(0.5)
        logs = "\n".join(w.log_tail("worker") for w in (worker, second_s3_worker))
        assert job.state == "succeeded", f"{job.error}\n{logs}"
        assert job.num_processes == 2
        ranks = {line.rank for line in client.jobs.logs(job.id, limit=5000).data}
        assert {0, 1} <= ranks, "both nodes' ranks ran"
        checkpoint = client.jobs.checkpoints(job.id)[-1]
        downloaded = client.jobs.download_checkpoint(job.id, checkpoint, tmp_path)
    assert hashlib.sha256(downloaded.read_bytes()).hexdigest() == checkpoint.sha256
    # Sharded (ZeRO) across two machines: node 1's shards reached rank 0's archive.
    assert downloaded.name.endswith(".dcp.tar")
    from ace3.runtime.checkpoint.sharded import consolidate

    weights = consolidate(downloaded)["model"]
    expected = load_example("model").build_model().state_dict()
    assert {k: tuple(v.shape) for k, v in weights.items()} == {
        k: tuple(v.shape) for k, v in expected.items()
    }
    engine = make_sync_engine(api.env["ACE3_DATABASE_URL"], pooled=False)
    try:
        with engine.connect() as connection:
            nodes = connection.execute(select(JobNode).where(JobNode.job_id == job.id)).all()
    finally:
        engine.dispose()
    assert len({node.worker_id for node in nodes}) == 2, "the nodes ran on the two workers"
