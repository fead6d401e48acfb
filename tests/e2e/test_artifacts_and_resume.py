"""End to end through the SDK with real torchrun jobs: files a job writes under its artifacts
directory reach the user's machine while it runs (including one that keeps changing), and a new
job started from a stored checkpoint continues exactly where that job stopped."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

import ace3
from ace3.trainers.downloads import ArtifactSync, CheckpointSync
from tests.conftest import DigitsFiles

pytestmark = pytest.mark.slow

# The engine does not write artifacts by itself yet, so this model file does, as its loggers
# will: rank 0 finds the job's output directory in the job file named on its command line
# (`python -m ace3.runtime --job JOB_DIR/job.json`) and writes under `output_dir/artifacts/`.
ARTIFACT_WRITING_MODEL = """
import json
import os
import sys
import time
from pathlib import Path

from torch import nn

IS_MAIN = os.environ.get("RANK", "0") == "0"
_steps = 0


def artifacts_dir() -> Path:
    job_file = Path(sys.argv[sys.argv.index("--job") + 1])
    return Path(json.loads(job_file.read_text())["output_dir"]) / "artifacts"


def build_model(hidden: int = 32) -> nn.Module:
    if IS_MAIN:
        root = artifacts_dir()
        (root / "tensorboard" / "nested").mkdir(parents=True, exist_ok=True)
        (root / "tensorboard" / "nested" / "blob.bin").write_bytes(bytes(range(256)) * 800)
        (root / "model_checkpoint_0").mkdir(exist_ok=True)
        (root / "model_checkpoint_0" / "config.json").write_text(json.dumps({"hidden": hidden}))
        (root / "unmapped").mkdir(exist_ok=True)
        (root / "unmapped" / "ignored.txt").write_text("not mapped locally")
        (root / "tensorboard" / "hostname").symlink_to("/etc/hostname")
        (root / "tensorboard" / ".events.tmp-1").write_text("an atomic write in progress")
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def compute_loss(model, batch):
    global _steps
    inputs, targets = batch
    logits = model(inputs)
    if model.training and IS_MAIN:
        _steps += 1
        (artifacts_dir() / "tensorboard" / "progress.txt").write_text(f"step={_steps}\\n")
        time.sleep(0.06)  # long enough for the worker to sync the file while it changes
    return nn.functional.cross_entropy(logits, targets), logits
"""


def _wait_terminal(client: ace3.Client, job_id: str, timeout: float = 240) -> ace3.Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.jobs.retrieve(job_id)
        if job.is_terminal:
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s")


def test_artifacts_a_job_writes_are_synced_to_local_directories_while_it_runs(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    model_file = tmp_path / "artifact_model.py"
    model_file.write_text(ARTIFACT_WRITING_MODEL)
    model = client.load_model(model_file)
    train = client.load_dataset(digits_files.train)
    config = ace3.TrainingConfig(num_gpus=1, batch_size=64, epochs=2, seed=0)
    job = client.jobs.create(model_id=model.id, dataset_id=train.id, config=config)

    local_tb, local_ckpt = tmp_path / "tb", tmp_path / "model_checkpoint"
    sync = ArtifactSync(
        client, job.id, {"tensorboard": local_tb, "artifact://model_checkpoint_0": local_ckpt}
    )
    written_while_running: list[Path] = []
    deadline = time.monotonic() + 240
    while not client.jobs.retrieve(job.id).is_terminal:
        assert time.monotonic() < deadline, "the job did not finish"
        written_while_running += sync.sync()
        time.sleep(0.3)
    sync.sync(raise_errors=True)  # what the job left, after it ended

    finished = client.jobs.retrieve(job.id)
    assert finished.state == "succeeded", finished.error
    assert written_while_running, "files arrived while the job ran"
    steps = finished.final_metrics["steps"]

    artifacts = {artifact.path: artifact for artifact in client.jobs.artifacts(job.id)}
    assert set(artifacts) == {
        "tensorboard/progress.txt",
        "tensorboard/nested/blob.bin",
        "model_checkpoint_0/config.json",
        "unmapped/ignored.txt",
    }, "no link, no temporary file"
    assert artifacts["tensorboard/progress.txt"].version >= 2, "synced while it changed"

    expected = {
        local_tb / "progress.txt": f"step={steps}\n".encode(),
        local_tb / "nested" / "blob.bin": bytes(range(256)) * 800,
        local_ckpt / "config.json": b'{"hidden": 32}',
    }
    for path, content in expected.items():
        assert path.read_bytes() == content, path
    local_files = sorted(p for p in tmp_path.rglob("*") if p.is_file() and p != model_file)
    assert local_files == sorted(expected), "unmapped artifacts stay on the server"
    assert (
        hashlib.sha256(expected[local_tb / "progress.txt"]).hexdigest()
        == artifacts["tensorboard/progress.txt"].sha256
    )


def test_a_job_started_from_a_stored_checkpoint_continues_it_exactly(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    import torch

    model = client.load_model(digits_files.model)
    train = client.load_dataset(digits_files.train)
    base = {"num_gpus": 1, "batch_size": 64, "learning_rate": 3e-3, "seed": 0, "log_interval": 1}
    two_epochs = ace3.TrainingConfig(**base, epochs=2)
    four_epochs = ace3.TrainingConfig(**base, epochs=4)
    ids = {"model_id": model.id, "dataset_id": train.id}
    first = client.jobs.create(**ids, config=two_epochs)
    uninterrupted = client.jobs.create(**ids, config=four_epochs)  # the reference run

    first_done = _wait_terminal(client, first.id)
    assert first_done.state == "succeeded", first_done.error
    first_steps = first_done.final_metrics["steps"]
    local_first = tmp_path / "first"
    CheckpointSync(client, first.id, local_first, max_checkpoints=1).sync(raise_errors=True)
    (downloaded,) = local_first.iterdir()
    (origin,) = client.checkpoints.find_file(downloaded)  # a local file back to its id
    assert origin.job_id == first.id and origin.step == first_steps

    key = f"continue-{first.id}"
    continued = client.jobs.create(
        **ids, config=four_epochs, resume_from_checkpoint=origin, idempotency_key=key
    )
    assert continued.resume_from_checkpoint == origin.id
    replay = client.jobs.create(
        **ids, config=four_epochs, resume_from_checkpoint=origin.id, idempotency_key=key
    )
    assert replay.id == continued.id
    with pytest.raises(ace3.ConflictError):
        client.jobs.create(**ids, config=four_epochs, idempotency_key=key)

    continued_done = _wait_terminal(client, continued.id)
    reference_done = _wait_terminal(client, uninterrupted.id)
    assert continued_done.state == "succeeded", continued_done.error
    assert reference_done.state == "succeeded", reference_done.error
    steps = [metric.step for metric in client.jobs.metrics(continued.id)]
    assert min(steps) == first_steps + 1, "it continues at the next step"
    assert continued_done.final_metrics["steps"] == reference_done.final_metrics["steps"]

    def final_weights(job_id: str) -> dict[str, torch.Tensor]:
        path = client.job(job_id).download_checkpoint(to=tmp_path / f"{job_id}.pt")
        return torch.load(path, weights_only=True)["model"]

    continued_weights, reference_weights = (
        final_weights(continued.id),
        final_weights(uninterrupted.id),
    )
    assert continued_weights.keys() == reference_weights.keys()
    for name, tensor in reference_weights.items():
        assert torch.equal(continued_weights[name], tensor), name
