"""``Trainer.train`` gives back what its overloads say (tests/types_check/trainer_returns.py
pins the same calls for the type checker): a remote model a TrainingResult, or a JobHandle with
``wait=False``; a live module a LocalTrainingResult. The run never sees the trainer itself."""

from __future__ import annotations

from typing import assert_type

import httpx
import torch
from torch.utils.data import TensorDataset

import ace3
from ace3.client import DatasetRef, ModelRef
from ace3.trainers.in_process import LocalTrainingResult
from ace3.trainers.run_objects import TrainerObjects
from tests.unit.sdk.sdk_fakes import MockAPI, dataset_json, job_json, model_json, sse_response


def _refs(api: MockAPI) -> tuple[ModelRef, DatasetRef]:
    client = api.client()
    model = ModelRef(ace3.Model.model_validate(model_json()), client)
    return model, DatasetRef(ace3.Dataset.model_validate(dataset_json()), client)


def _serve_succeeded_job(api: MockAPI) -> None:
    done = job_json("succeeded", final_metrics={"train_loss": 0.5})
    api.route("POST", "/v1/jobs", httpx.Response(201, json=job_json("queued")))
    api.route("GET", "/v1/jobs/job_1", httpx.Response(200, json=done))
    api.route("GET", "/v1/jobs/job_1/events", sse_response([("end", done, "1:0")]))
    api.route("GET", "/v1/jobs/job_1/metrics", httpx.Response(200, json={"data": []}))
    api.route("GET", "/v1/jobs/job_1/checkpoints", httpx.Response(200, json={"data": []}))


def test_a_remote_model_gives_a_training_result_and_wait_false_a_handle(api: MockAPI) -> None:
    model, dataset = _refs(api)
    _serve_succeeded_job(api)
    trainer = ace3.Trainer()
    result = assert_type(trainer.train(model, dataset, show_progress=False), ace3.TrainingResult)
    assert type(result) is ace3.TrainingResult and result.final_metrics == {"train_loss": 0.5}
    assert isinstance(trainer.last_job, ace3.JobHandle) and trainer.last_job.id == "job_1"
    handle = assert_type(trainer.train(model, dataset, wait=False), ace3.JobHandle)
    assert type(handle) is ace3.JobHandle and handle.id == "job_1"
    assert trainer.last_job is handle


def test_a_live_module_gives_a_local_training_result() -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3))
    data = TensorDataset(torch.randn(16, 4), torch.randint(0, 3, (16,)))
    config = ace3.TrainingConfig(epochs=1, batch_size=8, log_interval=1)
    result = ace3.Trainer(config).train(module, data)
    assert type(result) is LocalTrainingResult and result.model is module
    assert result.job_id is None and "train_loss" in result.history


def test_a_run_reads_the_trainer_objects_not_the_trainer(tmp_path) -> None:
    checkpoints = ace3.CheckpointConfig(save_dir=str(tmp_path / "ckpt"))
    trainer = ace3.Trainer(checkpoint_config=checkpoints, callbacks=[ace3.Callback()])
    objects = trainer._objects()
    assert isinstance(objects, TrainerObjects)
    assert objects.checkpoint_dir == (tmp_path / "ckpt").resolve()
    assert objects.callbacks == tuple(trainer.callbacks) and objects.resume_source is None
