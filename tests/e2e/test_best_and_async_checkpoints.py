"""End to end: one tiny remote job with keep_best_checkpoint and async_save, ZeRO-3 on 2 gloo
ranks (so the sharded path: dcp.async_save over its own group, rank 0 packs the tar once every
rank's shards are written). The worker records each asynchronously written checkpoint only once
it verified the file, judges the best one itself, keeps it beside the newest max_checkpoints,
and the SDK finds and downloads it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import ace3
from ace3.files import sha256_file
from tests.conftest import DigitsFiles

pytestmark = pytest.mark.slow


def test_a_remote_job_keeps_its_best_checkpoint_and_saves_asynchronously(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    model = client.load_model(digits_files.model)
    train = client.load_dataset(digits_files.train)
    validation = client.load_dataset(digits_files.validation)
    # mode="max" on val_loss: the first (least trained) checkpoint is the best, so every newer
    # one but the newest is pruned around it.
    config = ace3.TrainingConfig(
        num_gpus=2, zero_stage=3, batch_size=64, epochs=1, max_steps=9, save_interval=3, max_checkpoints=1,
        learning_rate=0.05, seed=0, keep_best_checkpoint=True, checkpoint_monitor="val_loss",
        checkpoint_mode="max", async_save=True,
    )  # fmt: skip
    created = client.jobs.create(
        model_id=model.id, dataset_id=train.id, validation_dataset_id=validation.id, config=config
    )
    deadline = time.monotonic() + 240
    while not (job := client.jobs.retrieve(created.id)).is_terminal:
        assert time.monotonic() < deadline, "the job did not finish"
        time.sleep(0.5)
    assert job.state == "succeeded", job.error
    checkpoints = client.jobs.checkpoints(job.id)
    assert [(c.step, c.best) for c in checkpoints] == [(3, True), (9, False)]
    first, last = checkpoints
    assert first.monitor_value is not None and last.monitor_value is not None
    assert first.monitor_value > last.monitor_value  # it trained; "max" kept the worst
    handle = client.job(job.id)
    best = handle.best_checkpoint()
    assert best is not None and best.id == first.id
    path = handle.download_checkpoint("best", tmp_path)
    assert path.name == "step-00000003.dcp.tar" and sha256_file(path) == first.sha256
    loaded = ace3.load_checkpoint(path)
    assert loaded["step"] == 3 and loaded["carry"]["best_checkpoint"] == [3, first.monitor_value]
