"""Trainers: refuse what is not implemented before any request; submit, follow and return
a TrainingResult, or raise JobFailedError / JobCancelledError."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import httpx
import pytest

import ace3
from ace3.client import DatasetRef, ModelRef
from tests.unit.sdk.sdk_fakes import (
    MockAPI,
    dataset_json,
    job_json,
    log,
    metric,
    model_json,
    sse_response,
)


@pytest.fixture
def refs(api: MockAPI) -> tuple[ModelRef, DatasetRef]:
    client = api.client()
    model = ModelRef(ace3.Model.model_validate(model_json()), client)
    dataset = DatasetRef(ace3.Dataset.model_validate(dataset_json()), client)
    return model, dataset


# -- refusals before any request ------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "fields"),
    [
        (
            ace3.TrainingConfig(zero_stage=2, mixed_precision=True, amp_level="O3"),
            ["amp_level"],
        ),
        (
            ace3.TrainingConfig(num_gpus=2, num_nodes=2, zero_stage=3, async_save=True),
            ["async_save"],
        ),
    ],
)
def test_unsupported_settings_are_refused_before_any_request(api, refs, config, fields):
    model, dataset = refs
    with pytest.raises(ace3.UnsupportedFeatureError) as caught:
        ace3.DistributedTrainer(config).train(model, dataset)
    assert [problem.field for problem in caught.value.problems] == fields
    for field in fields:
        assert field in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert api.requests == []


def test_model_and_pipeline_parallel_misfits_are_refused_with_reasons(api, refs):
    model, dataset = refs
    config = ace3.TrainingConfig(parallelism="model", num_gpus=4)
    with pytest.raises(ace3.UnsupportedFeatureError, match="model_sharding_strategy"):
        ace3.ModelParallelTrainer(config).train(model, dataset)
    config = ace3.TrainingConfig(parallelism="pipeline", num_stages=4, micro_batch_size=16)
    with pytest.raises(ace3.UnsupportedFeatureError, match="1f1b schedule needs") as caught:
        ace3.PipelineParallelTrainer(config).train(model, dataset)
    assert {p.field for p in caught.value.problems} == {"micro_batch_size"}
    assert api.requests == []


def test_unsupported_settings_are_refused_even_without_an_api_key(tmp_path: Path):
    config = ace3.TrainingConfig(num_stages=2)
    with pytest.raises(ace3.UnsupportedFeatureError, match="num_stages"):
        ace3.Trainer(config).train(str(tmp_path / "model.py"), str(tmp_path / "data.npz"))


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ("amp_config", "amp_config must be an ace3.AMPConfig"),
        ("checkpoint_config", "checkpoint_config must be an ace3.CheckpointConfig"),
        ("callbacks", r"callbacks\[0\] must be an ace3.Callback"),
        ("logger", r"logger\[0\] must be an ace3 logger"),
    ],
)
def test_trainer_arguments_of_the_wrong_type_are_refused(argument, message):
    value = [object()] if argument == "callbacks" else object()
    with pytest.raises(TypeError, match=message):
        ace3.Trainer(**{argument: value})


def test_amp_and_checkpoint_configs_set_the_job_fields():
    trainer = ace3.Trainer(
        amp_config=ace3.AMPConfig(opt_level="O2", loss_scale=128.0, min_loss_scale=2.0),
        checkpoint_config=ace3.CheckpointConfig(
            save_dir="./checkpoints", save_interval=7, max_checkpoints=2, save_optimizer=False
        ),
    )
    config = trainer.resolve_config()
    assert (config.mixed_precision, config.amp_level, config.loss_scaling) == (True, "O2", 128.0)
    assert config.min_loss_scale == 2.0
    assert (config.save_interval, config.max_checkpoints, config.save_optimizer) == (7, 2, False)


def test_resume_without_a_checkpoint_and_a_missing_file_are_refused(api, refs, tmp_path):
    model, dataset = refs
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume"):
        ace3.Trainer().train(model, dataset, resume=True)
    with pytest.raises(FileNotFoundError, match="checkpoint file not found"):
        ace3.Trainer().load_checkpoint(str(tmp_path / "checkpoints" / "checkpoint-5000.pt"))
    assert api.requests == []


def test_parallel_trainers_check_the_parallelism_value():
    with pytest.raises(ValueError, match="DataParallelTrainer runs parallelism='data'"):
        ace3.DataParallelTrainer(ace3.TrainingConfig(parallelism="pipeline"))
    with pytest.raises(ValueError, match="PipelineParallelTrainer"):
        ace3.ModelParallelTrainer(ace3.TrainingConfig(parallelism="pipeline"))
    assert ace3.ModelParallelTrainer().config.parallelism == "model"
    assert ace3.PipelineParallelTrainer(ace3.DistributedConfig()).config.parallelism == "pipeline"
    assert (
        ace3.DistributedTrainer(ace3.TrainingConfig(parallelism="model")).config.parallelism
        == "model"
    )


def test_rendezvous_settings_warn_and_are_not_sent():
    config = ace3.DistributedConfig(
        num_gpus=2, node_rank=0, master_addr="10.0.0.1", master_port=29500
    )
    trainer = ace3.DistributedTrainer(config)
    with pytest.warns(UserWarning, match="assigns ranks and the rendezvous address itself"):
        resolved = trainer.resolve_config(epochs=7)
    assert (resolved.node_rank, resolved.master_addr, resolved.master_port) == (None, None, None)
    assert resolved.epochs == 7 and resolved.num_gpus == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ace3.Trainer().resolve_config()  # nothing to warn about


def test_dataset_arguments_are_checked(api, refs):
    model, dataset = refs
    with pytest.raises(ValueError, match="not both"):
        ace3.Trainer().train(model, dataset, train_dataset=dataset)
    with pytest.raises(ValueError, match="dataset is required"):
        ace3.Trainer().train(model)
    with pytest.raises(TypeError, match="load_model"):
        ace3.Trainer().train(object(), dataset)
    assert api.requests == []


# -- a full run over the fake API -----------------------------------------------------------

FINAL = {"train_loss": 0.21, "val_loss": 0.30, "val_accuracy": 0.91}
METRICS = [
    metric(5, "train_loss", 0.9, epoch=0.5, id=1),
    metric(5, "epoch", 0.5, epoch=0.5, id=2),
    metric(10, "val_loss", 0.5, epoch=1, id=3),
    metric(10, "val_accuracy", 0.93, epoch=1, id=4),
    metric(15, "train_loss", 0.3, epoch=1.5, id=5),
    metric(20, "val_loss", 0.3, epoch=2, id=6),
    metric(20, "val_accuracy", 0.91, epoch=2, id=7),
]
CHECKPOINT = {
    "id": "ck_1",
    "name": "step-00000020.pt",
    "step": 20,
    "epoch": 2,
    "attempt": 1,
    "sha256": "a" * 64,
    "size_bytes": 100,
    "metrics": FINAL,
    "created_at": "2025-01-01T00:00:00Z",
}


def serve_job(api: MockAPI, end_state: str, **end_fields) -> None:
    events = [
        ("state", job_json(state="queued"), "0:0"),
        ("state", job_json(state="running"), "0:0"),
        # the worker stores the engine's start record: the total is known from the first step
        ("state", job_json(state="running", plan={"total_steps": 20, "epochs": 2}), "0:0"),
    ]
    events += [("metric", item, f"{item['id']}:0") for item in METRICS]
    events += [
        ("log", log(1, "epoch 1 done"), "7:1"),
        ("log", log(2, "Traceback: boom", rank=1, stream="stderr"), "7:2"),
    ]
    events += [("end", job_json(state=end_state, **end_fields), "7:2")]
    api.route("POST", "/v1/jobs", httpx.Response(201, json=job_json()))
    api.route("GET", "/v1/jobs/job_1/events", sse_response(events))
    api.route("GET", "/v1/jobs/job_1/metrics", httpx.Response(200, json={"data": METRICS}))
    api.route("GET", "/v1/jobs/job_1/checkpoints", httpx.Response(200, json={"data": [CHECKPOINT]}))


def test_train_returns_a_training_result(api, refs, capsys):
    model, dataset = refs
    serve_job(api, "succeeded", final_metrics=FINAL, exit_code=0)
    config = ace3.TrainingConfig(
        num_gpus=1, batch_size=32, learning_rate=1e-4, mixed_precision=True
    )
    result = ace3.DistributedTrainer(config).train(
        model=model, train_dataset=dataset, validation_dataset=dataset, epochs=2, name="run"
    )
    assert isinstance(result, ace3.TrainingResult)
    assert result.job_id == "job_1" and result.job.state == "succeeded"
    assert result.final_metrics == FINAL
    assert result.best_val_accuracy == 0.93 and result.best_val_loss == 0.3
    assert result.val_accuracy == 0.91  # final metrics are attributes too
    assert result.history["train_loss"] == [(5, 0.9), (15, 0.3)]
    assert result.history_by_step()[0] == {"step": 5, "train_loss": 0.9, "epoch": 0.5}
    assert [c.name for c in result.checkpoints] == ["step-00000020.pt"]
    assert [line.line for line in result.logs_tail] == ["epoch 1 done", "Traceback: boom"]

    create = next(r for r in api.requests if r.url.path == "/v1/jobs")
    body = json.loads(create.content)
    assert body["model_id"] == "mdl_1" and body["dataset_id"] == "ds_1"
    assert body["validation_dataset_id"] == "ds_1" and body["name"] == "run"
    assert body["config"]["epochs"] == 2 and body["config"]["mixed_precision"] is True
    assert create.headers["idempotency-key"]

    out = capsys.readouterr().out  # captured stdout is not a terminal: plain lines
    assert "job job_1: running" in out
    assert "step 5/20 epoch 0.5: train_loss=0.9" in out
    assert "[rank 1] Traceback: boom" in out
    assert "job job_1 succeeded" in out


def test_train_failed_raises_job_failed_error_with_log_lines(api, refs):
    model, dataset = refs
    serve_job(api, "failed", error="worker exited with code 1", exit_code=1)
    with pytest.raises(ace3.JobFailedError) as caught:
        ace3.Trainer().train(model, dataset, show_progress=False)
    error = caught.value
    assert error.job.state == "failed"
    assert [line.line for line in error.logs_tail] == ["epoch 1 done", "Traceback: boom"]
    assert "worker exited with code 1" in str(error)
    assert "[rank 1] Traceback: boom" in str(error)


def test_train_cancelled_raises_job_cancelled_error(api, refs):
    model, dataset = refs
    serve_job(api, "cancelled")
    with pytest.raises(ace3.JobCancelledError, match="job_1 was cancelled"):
        ace3.Trainer().train(model, dataset)


def test_wait_false_returns_a_job_handle(api, refs):
    model, dataset = refs
    serve_job(api, "succeeded", final_metrics=FINAL)
    handle = ace3.Trainer().train(model, dataset, wait=False, idempotency_key="my-key")
    assert isinstance(handle, ace3.JobHandle) and handle.id == "job_1"
    assert api.requests[-1].headers["idempotency-key"] == "my-key"
    assert "/v1/jobs/job_1/events" not in api.paths()
    result = handle.wait()
    assert result.best_val_accuracy == 0.93


def test_train_with_paths_uploads_through_the_default_client(api, tmp_path: Path):
    (tmp_path / "model.py").write_text("def build_model():\n    pass\n")
    (tmp_path / "data.npz").write_bytes(b"data")
    api.route("GET", "/v1/models", httpx.Response(200, json={"data": [], "next_cursor": None}))
    api.route("POST", "/v1/models", httpx.Response(201, json=model_json()))
    api.route("GET", "/v1/datasets", httpx.Response(200, json={"data": [], "next_cursor": None}))
    api.route("POST", "/v1/datasets", httpx.Response(201, json=dataset_json()))
    serve_job(api, "succeeded", final_metrics=FINAL)
    api.client()  # becomes the default client
    result = ace3.Trainer().train(
        str(tmp_path / "model.py"), str(tmp_path / "data.npz"), show_progress=False
    )
    assert result.final_metrics == FINAL
    assert api.paths("POST")[:2] == ["/v1/models", "/v1/datasets"]


def test_ctrl_c_while_waiting_cancels_the_job(api, refs, capsys):
    model, dataset = refs

    def interrupt(request):
        raise KeyboardInterrupt

    api.route("POST", "/v1/jobs", httpx.Response(201, json=job_json()))
    api.route("GET", "/v1/jobs/job_1/events", interrupt)
    api.route(
        "POST", "/v1/jobs/job_1/cancel", httpx.Response(202, json=job_json(state="cancelling"))
    )
    with pytest.raises(KeyboardInterrupt):
        ace3.Trainer().train(model, dataset)
    assert "/v1/jobs/job_1/cancel" in api.paths("POST")
    assert "cancelled job job_1" in capsys.readouterr().out


def test_wait_timeout_leaves_the_job_running(api):
    api.route("GET", "/v1/jobs/job_1", httpx.Response(200, json=job_json(state="running")))
    api.route(
        "GET",
        "/v1/jobs/job_1/events",
        httpx.Response(
            200, content=b": keep-alive\n\n", headers={"content-type": "text/event-stream"}
        ),
    )
    handle = api.client().job("job_1")
    with pytest.raises(TimeoutError, match="keeps running"):
        handle.wait(timeout=0)
    assert "/v1/jobs/job_1/cancel" not in api.paths()


def test_result_exposes_final_metrics_as_attributes():
    job = ace3.Job.model_validate(job_json(state="succeeded", final_metrics={"val_loss": 0.5}))
    result = ace3.TrainingResult.from_job(job, [])
    assert result.val_loss == 0.5 and result.best_val_loss == 0.5
    assert result.best_val_accuracy is None
    with pytest.raises(AttributeError, match="final metrics: \\['val_loss'\\]"):
        _ = result.val_accuracy


def test_object_configs_only_override_the_fields_they_set():
    base = ace3.TrainingConfig(save_interval=50, max_checkpoints=4, min_loss_scale=8.0)
    trainer = ace3.Trainer(
        base,
        amp_config=ace3.AMPConfig(opt_level="O1"),
        checkpoint_config=ace3.CheckpointConfig(save_dir="./ckpts", save_optimizer=False),
    )
    config = trainer.resolve_config()
    assert (config.save_interval, config.max_checkpoints, config.save_optimizer) == (50, 4, False)
    assert config.mixed_precision and config.min_loss_scale == 8.0
