"""Knowledge distillation through the real stack (API, Postgres, Redis, Celery worker, torchrun
with 2 gloo ranks): a teacher trained by one job distils into a smaller student in a second
job, the teacher sent as ids (its stored model file, its weights uploaded from a local file)
that the API checks for ownership and the worker copies into the job's directory; the loss
parts are reported."""

from __future__ import annotations

from pathlib import Path

import pytest

import ace3
from ace3.errors import ConflictError, ValidationError
from tests.conftest import DigitsFiles

pytestmark = pytest.mark.slow

STUDENT = """
from torch import nn


def build_model(hidden: int = 16) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
"""


def test_a_remote_job_distils_a_stored_teacher_into_a_student(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    train = client.load_dataset(digits_files.train)
    validation = client.load_dataset(digits_files.validation)
    teacher = client.load_model(digits_files.model)
    teacher_run = ace3.Trainer(
        ace3.TrainingConfig(batch_size=64, learning_rate=3e-3, seed=0, dropout=0.0)
    ).train(model=teacher, train_dataset=train, validation_dataset=validation, epochs=2)
    assert teacher_run.final_metrics["val_accuracy"] > 0.9
    # The teacher's weights as a local file: the SDK uploads them (read weights-only, as
    # safetensors) and sends their id, as it does for init_from.
    final = teacher_run.checkpoints[-1]
    local_weights = tmp_path / final.name
    client.jobs.download_checkpoint(teacher_run.job_id, final.id, local_weights)

    (tmp_path / "student.py").write_text(STUDENT)
    settings = ace3.DistillationConfig(
        teacher=teacher, teacher_checkpoint=str(local_weights),
        teacher_model_kwargs={"dropout": 0.0},
        temperature=2.0, alpha=0.7, feature_layers={"1": "1"}, feature_loss_weight=0.5,
    )  # fmt: skip
    assert settings.teacher_model_id == teacher.id
    assert settings.teacher_checkpoint_path == str(local_weights)
    config = ace3.TrainingConfig(
        num_gpus=2, batch_size=64, learning_rate=1e-2, seed=0, log_interval=5,
        distillation=settings,
    )  # fmt: skip
    result = ace3.DistributedTrainer(config).train(
        model=client.load_model(tmp_path / "student.py"),
        train_dataset=train, validation_dataset=validation, epochs=2,
    )  # fmt: skip
    history = result.history
    for name in ("kd_loss", "feature_loss", "task_loss"):
        assert name in result.final_metrics, name
        assert [s for s, _ in history[name]] == [s for s, _ in history["train_loss"]], name
    # The student follows the teacher (the KL falls) and learns the task from it.
    assert history["kd_loss"][-1][1] < 0.5 * history["kd_loss"][0][1]
    assert history["feature_loss"][-1][1] < history["feature_loss"][0][1]  # 16 -> 128 projected
    assert result.final_metrics["val_accuracy"] > 0.8
    lines = [line.line for line in client.jobs.logs(result.job_id, limit=5000).data]
    assert any(
        line.startswith(
            "distillation: teacher Sequential (26,122 parameters, weights from weights.safetensors)"
        )
        for line in lines
    ), lines[:20]

    # Another owner's (or no) teacher: refused by the API with the field, before any job runs.
    no_file = {"teacher_checkpoint_path": None}  # (client.jobs.create uploads .safetensors only)
    body = config.model_copy(
        update={
            "distillation": settings.model_copy(
                update={"teacher_model_id": "no-such-model", **no_file}
            )
        }
    )
    with pytest.raises(ValidationError, match="teacher_model_id"):
        client.jobs.create(model_id=teacher.id, dataset_id=train.id, config=body)

    # A stored model that a live job distils from cannot be deleted (like the model it trains).
    copy = tmp_path / "teacher_copy.py"
    copy.write_bytes(digits_files.model.read_bytes() + b"\n# another teacher\n")
    busy_teacher = client.load_model(copy)
    body = config.model_copy(
        update={
            "epochs": 200,
            "distillation": settings.model_copy(
                update={"teacher_model_id": busy_teacher.id, **no_file}
            ),
        }
    )
    job = client.jobs.create(model_id=teacher.id, dataset_id=train.id, config=body)
    try:
        with pytest.raises(ConflictError, match=job.id):
            client.models.delete(busy_teacher.id)
    finally:
        client.jobs.cancel(job.id)
