"""Fine-tuning through the real stack (API, Postgres, Redis, Celery worker, torchrun with 2 gloo
ranks): a job with ``freeze`` trains every other parameter and leaves the frozen ones bitwise
as the model file built them, with no optimizer state for them."""

from __future__ import annotations

from pathlib import Path

import pytest

import ace3
from tests.conftest import DigitsFiles, load_example

pytestmark = pytest.mark.slow


def test_a_remote_job_with_freeze_keeps_the_frozen_layers_bitwise(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    import torch

    config = ace3.TrainingConfig(
        num_gpus=2, batch_size=64, learning_rate=3e-3, seed=0, freeze=["0", "3.weight"]
    )
    result = ace3.DistributedTrainer(config).train(
        model=client.load_model(digits_files.model),
        train_dataset=client.load_dataset(digits_files.train),
        epochs=1,
    )
    final = client.jobs.checkpoints(result.job_id)[-1]
    target = tmp_path / final.name
    client.jobs.download_checkpoint(result.job_id, final.id, target)
    checkpoint = torch.load(target, weights_only=True)

    torch.manual_seed(config.seed)  # what the engine does before it calls build_model
    initial = load_example("model").build_model().state_dict()
    frozen = {"0.weight", "0.bias", "3.weight"}
    for name, value in checkpoint["model"].items():
        assert torch.equal(value, initial[name]) == (name in frozen), name
    trainable = len(initial) - len(frozen)
    assert sum(len(group["params"]) for group in checkpoint["optimizer"]["param_groups"]) == (
        trainable
    )
    lines = [line.line for line in client.jobs.logs(result.job_id, limit=5000).data]
    assert any(
        line.startswith(f"training {trainable} of {len(initial)} parameter tensors")
        for line in lines
    )
