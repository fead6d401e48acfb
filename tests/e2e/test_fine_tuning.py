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


def test_init_from_starts_a_remote_job_from_another_jobs_weights(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    """A job started from another job's checkpoint begins at that job's validation loss, and a
    fine-tuning job started from a local copy of it (uploaded by the SDK as weights) beats the
    same job from scratch."""
    model = client.load_model(digits_files.model)
    train = client.load_dataset(digits_files.train)
    validation = client.load_dataset(digits_files.validation)

    def run(epochs: int = 1, **fields: object) -> ace3.TrainingResult:
        config = ace3.TrainingConfig(
            **{"batch_size": 64, "learning_rate": 3e-3, "seed": 0, **fields}
        )
        return ace3.Trainer(config).train(
            model=model, train_dataset=train, validation_dataset=validation, epochs=epochs
        )

    pretrained = run(num_gpus=2, epochs=2)
    source = client.jobs.checkpoints(pretrained.job_id)[-1]
    pretrained_loss = source.metrics["val_loss"]

    # A stored checkpoint (its handle), a rate too small to move the weights: the job's
    # validation after one step is the source job's.
    continued = run(init_from=source, learning_rate=1e-9, max_steps=1)
    assert continued.final_metrics["steps"] == 1
    assert continued.final_metrics["val_loss"] == pytest.approx(pretrained_loss, rel=1e-3)
    lines = [line.line for line in client.jobs.logs(continued.job_id, limit=5000).data]
    assert any(line.startswith(f"initialised from {source.name}") for line in lines)

    # A local checkpoint file: converted to safetensors and uploaded by the SDK.
    local = client.jobs.download_checkpoint(pretrained.job_id, source, tmp_path)
    fine_tuned = run(init_from=local, max_steps=4)
    scratch = run(max_steps=4)
    tuned_accuracy = fine_tuned.final_metrics["val_accuracy"]
    scratch_accuracy = scratch.final_metrics["val_accuracy"]
    assert tuned_accuracy > scratch_accuracy + 0.2, (tuned_accuracy, scratch_accuracy)
    job = client.jobs.retrieve(fine_tuned.job_id)
    assert job.config["init_from_checkpoint_id"] not in (None, source.id)  # the uploaded copy
