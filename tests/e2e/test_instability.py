"""The instability guard on the service (one remote job, 2 gloo ranks): ``stop`` fails the job
with the reason, the ``instability`` record reaches the job's log as the worker's notice and the
SDK as a typed record (``client.jobs.records``, the event stream, ``job.instabilities()``), and
the job's metrics carry ``grad_norm`` and each rank's memory and step time. The other actions
are proven in tests/integration/runtime/test_runtime_instability.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import ace3
from ace3.config.events import InstabilityRecord
from tests.conftest import DigitsFiles
from tests.model_files import UNSTABLE_MODEL_FILE

pytestmark = pytest.mark.slow


def test_stop_fails_the_job_with_the_reason_and_the_record_in_its_log(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    model_file = tmp_path / "unstable_model.py"
    model_file.write_text(
        UNSTABLE_MODEL_FILE
        + "\n\ndef build_remote():\n    return build_model(nan_at=4, inputs=64, classes=10)\n"
    )
    config = ace3.TrainingConfig(
        num_gpus=2, batch_size=64, log_interval=2, max_steps=8,
        instability=ace3.InstabilityConfig(action="stop"),
    )  # fmt: skip
    with pytest.raises(ace3.JobFailedError) as failure:
        ace3.Trainer(config).train(
            client.load_model(model_file, factory="build_remote"),
            client.load_dataset(digits_files.train),
            epochs=1,
            show_progress=False,
        )
    job = failure.value.job
    assert job.state == "failed" and job.attempt == 1, "an unstable run is not retried"
    assert "InstabilityError: training instability at step 4: loss nan" in (job.error or "")
    assert job.config["instability"]["action"] == "stop"
    notices = [line.line for line in client.jobs.iter_logs(job.id) if line.stream == "service"]
    assert "ace3: training instability at step 4: loss nan; run stopped" in notices
    (record,) = client.jobs.records(job.id, type="instability")
    assert isinstance(record.record, InstabilityRecord) and record.attempt == 1
    assert (record.step, record.record.action, record.record.reason) == (4, "stop", "loss nan")
    assert client.jobs.records(job.id, type="preempted") == []
    streamed = [event.data for event in client.jobs.events(job.id, timeout=60)]
    assert [item.record for item in streamed if isinstance(item, ace3.JobRecord)] == [record.record]
    assert client.job(job.id).instabilities() == [record.record]
    names = {metric.name for metric in client.jobs.metrics(job.id)}
    assert {"grad_norm", "memory_mb_rank0", "memory_mb_rank1", "step_time_ms_max"} <= names
