"""A dataset registered from a bucket (parquet shards on the session's SeaweedFS) through the
real API and worker: the worker streams its shards into the ranks; a worker SIGKILLed after a
mid-epoch checkpoint leaves the job to the next worker, which resumes it from that checkpoint
(and the stream's position in it) and ends with exactly the weights of an undisturbed run.
Another owner cannot train on the dataset, and a shard rewritten after registration fails the
job naming the shard.

The stack is this module's own (the shared one has no ``ACE3_DATASET_SOURCES``): the API and a
worker on a database of their own, a local artifact store, and the bucket read with the
service's S3 settings (``ACE3_S3_ENDPOINT_URL``, ``AWS_*``); a short lease, so the killed
worker's job is re-queued soon."""

from __future__ import annotations

import io
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import ace3
from tests.conftest import Stack, _stop, free_port, fresh_database, stack_env
from tests.e2e.conftest import processes_of_job, wait_for
from tests.model_files import SLOW_STEP_MODEL_FILE
from tests.object_store import ObjectStore
from tests.shard_sources import new_bucket, put, s3_client

pytestmark = pytest.mark.slow

SHARDS, ROWS = 4, 64  # 2 ranks of batches of 8: 16 steps an epoch
EPOCHS, SAVE_INTERVAL = 2, 6  # checkpoints at steps 6, 12, 18, 24, 30: none at an epoch's end
STEPS_PER_EPOCH = SHARDS * ROWS // 16


def _parquet(seed: int, rows: int = ROWS) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((rows, 64), dtype=np.float32)
    targets = (inputs[:, :10].argmax(axis=1)).astype(np.int64)
    table = pa.table({"inputs": list(inputs), "targets": targets})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=16)
    return buffer.getvalue()


class Sources(NamedTuple):
    stack: Stack
    client: ace3.Client
    bucket: str
    s3: Any  # a boto3 client of the bucket's store
    model: ace3.ModelRef


@pytest.fixture(scope="module")
def sources(
    redis_url: str, object_store: ObjectStore, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sources]:
    s3 = s3_client(object_store)
    bucket = new_bucket(s3, "e2e-streams")
    put(s3, bucket, {f"train/{i:03d}.parquet": _parquet(i) for i in range(SHARDS)})
    put(s3, bucket, {f"changed/{i:03d}.parquet": _parquet(10 + i, 16) for i in range(2)})
    root = tmp_path_factory.mktemp("streams-stack")
    (root / "slow_step.py").write_text(SLOW_STEP_MODEL_FILE)
    with fresh_database() as database_url:
        port = free_port()
        env = stack_env(root, database_url, redis_url) | {
            key: value for key, value in object_store.env(bucket).items() if key != "ACE3_STORAGE_URL"
        }  # fmt: skip
        env |= {"ACE3_DATASET_SOURCES": f"s3://{bucket}/", "ACE3_LEASE_SECONDS": "5"}
        stack = Stack(f"http://127.0.0.1:{port}", port, env, root)
        stack.start_worker()
        try:
            stack.start_api()
            key, _ = stack.create_key("streams")
            with ace3.Client(api_key=key, base_url=stack.base_url) as client:
                model = client.load_model(root / "slow_step.py")
                yield Sources(stack, client, bucket, s3, model)
        finally:
            for process in stack.processes.values():
                _stop(process)
            shutil.rmtree(root / "jobs", ignore_errors=True)
            shutil.rmtree(root / "dataset-cache", ignore_errors=True)


def _config(**overrides: Any) -> ace3.TrainingConfig:
    fields = {"num_gpus": 2, "batch_size": 16, "epochs": EPOCHS, "save_interval": SAVE_INTERVAL,
              "log_interval": 2, "seed": 5, "validation_split": 0, "shuffle_buffer": 16}  # fmt: skip
    return ace3.TrainingConfig(**(fields | overrides))


def _final_weights(client: ace3.Client, job_id: str, folder: Path) -> dict[str, Any]:
    import torch

    final = client.jobs.checkpoints(job_id)[-1]
    target = folder / f"{job_id}.pt"
    client.jobs.download_checkpoint(job_id, final.id, target)
    state = torch.load(target, weights_only=True)
    return {"step": state["step"], **state["model"]}


def _wait_for_checkpoint(sources: Sources, handle: Any, timeout: float = 120) -> None:
    """Until the job has a checkpoint; fails at once, with its logs, when the job ends first."""

    def checkpointed() -> bool:
        if sources.client.jobs.checkpoints(handle.id):
            return True
        job = handle.refresh()
        assert not job.is_terminal, f"{job.state}: {job.error}\n{_logs(sources, handle.id)}"
        return False

    try:
        wait_for(checkpointed, timeout, "a mid-epoch checkpoint")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_logs(sources, handle.id)}") from None


def _logs(sources: Sources, job_id: str) -> str:
    lines = [f"{line.rank} {line.line}" for line in sources.client.jobs.iter_logs(job_id)]
    return "\n".join(lines[-80:]) + "\n--- worker:\n" + sources.stack.log_tail("worker", 40)


def test_a_killed_worker_s_streaming_job_resumes_mid_epoch_with_the_same_weights(
    sources: Sources, tmp_path: Path
) -> None:
    """The undisturbed run trains beside the one whose worker is killed, on the first worker
    (whose two slots run both): its steps take no time, the other's 0.25 s (the model sleeps:
    the same weights), so the reference has ended before the worker is killed."""
    import torch

    client, stack = sources.client, sources.stack
    dataset = client.datasets.register(f"s3://{sources.bucket}/train/", format="parquet")
    assert (dataset.dataset.kind, dataset.dataset.shard_count) == ("remote", SHARDS)
    assert dataset.dataset.samples == SHARDS * ROWS
    trainer = ace3.DistributedTrainer(_config(), client=client)
    reference = trainer.train(sources.model, dataset, wait=False, model_kwargs={"delay": 0.0})
    handle = trainer.train(sources.model, dataset, wait=False, model_kwargs={"delay": 0.25})
    assert reference.wait(timeout=120).job.state == "succeeded"
    _wait_for_checkpoint(sources, handle)
    stack.kill_worker()
    wait_for(lambda: not processes_of_job(handle.id), 10, "the orphaned ranks to exit")
    saved = client.jobs.checkpoints(handle.id)[-1]
    assert handle.refresh().state == "running", "the job ended before the worker was killed"

    stack.env["ACE3_WORKER_SLOTS"] = "1"  # (one warm launcher to start: the job waits on it)
    stack.start_worker()
    job = handle.wait(timeout=180).job
    assert job.state == "succeeded" and job.attempt == 2, job.error

    logs = list(client.jobs.iter_logs(handle.id))
    resumed = [line.line for line in logs if line.attempt == 2 and "resumed from" in line.line]
    assert resumed and saved.name in resumed[0], resumed
    assert saved.step % STEPS_PER_EPOCH != 0, "resumed mid-epoch"
    assert any(
        line.stream == "service" and "dataset shard '000.parquet'" in line.line for line in logs
    ), "the worker said which shards it gave the job"
    finals = [_final_weights(client, j, tmp_path) for j in (reference.id, handle.id)]
    assert finals[0]["step"] == finals[1]["step"] == EPOCHS * STEPS_PER_EPOCH
    assert finals[0].keys() == finals[1].keys()
    for name in finals[0]:
        if name != "step":
            assert torch.equal(finals[0][name], finals[1][name]), f"{name} differs after the kill"


def test_another_owner_cannot_train_on_the_dataset(sources: Sources) -> None:
    dataset = sources.client.datasets.register(f"s3://{sources.bucket}/train/", format="parquet")
    other_key, _ = sources.stack.create_key("streams-other")
    with ace3.Client(api_key=other_key, base_url=sources.stack.base_url) as other:
        model = other.load_model(sources.stack.root / "slow_step.py")
        with pytest.raises((ace3.errors.NotFoundError, ace3.errors.ValidationError)) as refused:
            other.jobs.create(model_id=model.id, dataset_id=dataset.id, config=_config())
        assert "dataset" in str(refused.value)
        assert other.jobs.list().data == []


def test_a_shard_rewritten_after_registration_fails_the_job_naming_it(sources: Sources) -> None:
    client = sources.client
    dataset = client.datasets.register(f"s3://{sources.bucket}/changed/", format="parquet")
    sources.s3.put_object(
        Bucket=sources.bucket, Key="changed/001.parquet", Body=_parquet(99, 16)
    )  # (same rows, other values: another ETag)
    config = _config(num_gpus=1, epochs=1, save_interval=None)
    handle = ace3.DistributedTrainer(config, client=client).train(
        sources.model, dataset, wait=False, model_kwargs={"delay": 0.0}
    )
    with pytest.raises(ace3.errors.JobFailedError):
        handle.wait(timeout=120)
    job = handle.refresh()
    assert job.state == "failed" and job.attempt == 1, job.error
    assert "dataset shard '001.parquet'" in (job.error or "") and "changed" in (job.error or "")
