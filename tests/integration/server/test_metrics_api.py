"""GET /metrics on the real stack: after one tiny job the counters and histograms moved (jobs
succeeded, points ingested, the job route's requests by template, queue wait, time to first
metric, the event stream the SDK followed), and no owner data shows in it. The same job logs to
MLflow from this machine (MLflowLogger on a remote job), read back from the local store."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import ace3
from tests.conftest import DigitsFiles, Stack

JOB_ROUTE = (("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "2xx"))


def scrape(stack: Stack) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    response = httpx.get(f"{stack.base_url}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    values = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    return response.text, values


def test_metrics_move_after_a_job(
    stack: Stack, digits_files: DigitsFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tracking_uri = (tmp_path / "mlruns").as_uri()
    mlflow_logger = ace3.MLflowLogger(experiment_name="remote", tracking_uri=tracking_uri)
    key, owner_id = stack.create_key("metrics-owner")
    _, before = scrape(stack)
    with ace3.Client(api_key=key, base_url=stack.base_url) as client:
        config = ace3.TrainingConfig(num_gpus=1, batch_size=64, max_steps=2, log_interval=1)
        result = ace3.Trainer(config, logger=mlflow_logger).train(
            model=client.load_model(digits_files.model),
            train_dataset=client.load_dataset(digits_files.train),
            epochs=1,
            name="metrics-private-name",
        )
        assert client.jobs.retrieve(result.job_id).state == "succeeded"
    text, after = scrape(stack)

    def moved(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    # (>= 1: a job an earlier test of the session left behind may end meanwhile)
    assert moved("ace3_jobs", (("state", "succeeded"),)) >= 1
    assert moved("ace3_metric_points_ingested_total") >= 2
    assert moved("ace3_http_request_duration_seconds_count", JOB_ROUTE) >= 1
    assert moved("ace3_job_queue_wait_seconds_count") >= 1
    assert moved("ace3_job_time_to_first_metric_seconds_count") >= 1
    streams = (("route", "/v1/jobs/{job_id}/events"),)
    assert moved("ace3_sse_streams_opened_total", streams) >= 1
    assert after[("ace3_database_up", ())] == 1 and after[("ace3_workers_live", ())] >= 1
    assert after[("ace3_worker_slots", ())] >= after[("ace3_worker_slots_free", ())] >= 0
    for private in (result.job_id, owner_id, "metrics-private-name"):
        assert private not in text
    # The SDK's stream ended with the job: the gauge comes back down.
    deadline = time.monotonic() + 10
    while scrape(stack)[1][("ace3_sse_streams_open", ())] > 0:
        assert time.monotonic() < deadline, "an event stream stayed open after the job"
        time.sleep(0.2)

    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(tracking_uri=tracking_uri)
    [run] = mlflow.search_runs([mlflow.get_experiment_by_name("remote").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["ace3_job_id"] == result.job_id
    assert run.data.params["max_steps"] == "2"
    losses = mlflow.get_metric_history(run.info.run_id, "train_loss")
    assert [m.step for m in losses] == [1, 2]
