"""End to end through the SDK: real API, Postgres, Redis, Celery worker and torchrun (gloo, 2 ranks).

Trains scikit-learn's digits to >= 0.90 validation accuracy, cancels a running job and checks that
no process is left, and checks that a model file that raises fails its job (traceback in the logs)
while the worker keeps serving the next job.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import ace3
from tests.conftest import DigitsFiles, Stack
from tests.e2e.conftest import processes_of_job, wait_for

pytestmark = pytest.mark.slow


def test_digits_trains_to_090_with_two_ranks(
    client: ace3.Client,
    digits_files: DigitsFiles,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = client.load_model(digits_files.model)
    train_data = client.load_dataset(digits_files.train)
    val_data = client.load_dataset(digits_files.validation)
    config = ace3.TrainingConfig(
        num_gpus=2,
        batch_size=64,
        learning_rate=3e-3,
        weight_decay=0.01,
        seed=0,
        save_interval=40,
        log_interval=5,
    )
    result = ace3.DistributedTrainer(config).train(
        model=model,
        train_dataset=train_data,
        validation_dataset=val_data,
        epochs=12,
        show_progress=True,  # captured, so not a terminal: plain lines
    )

    assert result.best_val_accuracy is not None and result.best_val_accuracy >= 0.90
    assert result.final_metrics["val_accuracy"] >= 0.90
    job = client.jobs.retrieve(result.job_id)
    assert job.state == "succeeded" and job.exit_code == 0 and job.num_processes == 2
    # The engine's start record, kept on the job: the progress shows the total from step 1.
    assert job.plan is not None and job.plan.epochs == 12 and job.plan.world_size == 2
    assert job.plan.total_steps == 12 * job.plan.steps_per_epoch == result.final_metrics["steps"]
    progress = capsys.readouterr().out
    assert f"\nstep 1/{job.plan.total_steps} epoch 1: train_loss=" in progress

    names = {metric.name for metric in client.jobs.metrics(result.job_id)}
    assert {"train_loss", "val_loss", "val_accuracy", "samples_per_sec", "learning_rate"} <= names
    losses = [m.value for m in client.jobs.metrics(result.job_id, name="train_loss")]
    assert losses[-1] < losses[0], "training lowered the loss"

    ranks = {
        line.rank
        for line in client.jobs.logs(result.job_id, limit=5000).data
        if line.rank is not None
    }
    assert ranks == {0, 1}, "both torchrun ranks reported in the job's logs"

    checkpoints = client.jobs.checkpoints(result.job_id)
    assert len(checkpoints) >= 2, "periodic checkpoints plus the final one"
    final = checkpoints[-1]
    target = tmp_path / final.name
    client.jobs.download_checkpoint(result.job_id, final.id, target)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == final.sha256

    import torch

    state = torch.load(target, weights_only=True)
    assert "model" in state and state["step"] == final.step


def test_cancelling_a_running_job_leaves_no_process(
    client: ace3.Client, stack: Stack, digits_files: DigitsFiles
) -> None:
    model = client.load_model(digits_files.model)
    train_data = client.load_dataset(digits_files.train)
    handle = ace3.DistributedTrainer(
        ace3.TrainingConfig(num_gpus=2, batch_size=16, log_interval=1)
    ).train(model, train_data, epochs=10_000, wait=False)
    wait_for(lambda: bool(client.jobs.metrics(handle.id)), 120, "the job's first metric")
    assert processes_of_job(handle.id), "torchrun and its ranks are running"

    handle.cancel()
    wait_for(lambda: handle.refresh().state == "cancelled", 60, "the job to be cancelled")
    wait_for(lambda: not processes_of_job(handle.id), 10, "every process of the job to exit")
    assert stack.worker_alive()


def test_a_model_that_raises_fails_its_job_and_the_worker_keeps_working(
    client: ace3.Client, stack: Stack, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    broken = tmp_path / "broken_model.py"
    broken.write_text(
        "def build_model(**kwargs):\n    raise ValueError('boom from user code: bad hidden size')\n"
    )
    train_data = client.load_dataset(digits_files.train)
    with pytest.raises(ace3.JobFailedError) as failure:
        ace3.Trainer(ace3.TrainingConfig(num_gpus=2, batch_size=32)).train(
            client.load_model(broken), train_data, epochs=1, show_progress=False
        )
    job = failure.value.job
    assert job.state == "failed" and job.exit_code not in (None, 0)
    assert "boom from user code" in (job.error or "")
    lines = [line.line for line in client.jobs.logs(job.id, limit=5000).data]
    assert any("Traceback" in line for line in lines)
    assert any("ValueError: boom from user code" in line for line in lines)
    assert not processes_of_job(job.id)

    assert stack.worker_alive()
    after = ace3.Trainer(ace3.TrainingConfig(batch_size=64)).train(
        client.load_model(digits_files.model), train_data, epochs=1, show_progress=False
    )
    assert client.jobs.retrieve(after.job_id).state == "succeeded"


def test_the_quick_start_snippet_runs_as_written(
    stack: Stack, digits_files: DigitsFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The document's Quick Start, placeholders filled: 4 processes, mixed precision (bf16 on CPU)."""
    key, _ = stack.create_key("quick-start")
    monkeypatch.setenv("ACE3_BASE_URL", stack.base_url)
    snippet = f'''
import ace3

# Initialize client
client = ace3.Client(api_key="{key}")

# Load your model and dataset
model = client.load_model("{digits_files.model}")
dataset = client.load_dataset("{digits_files.train}")

# Configure distributed training
config = ace3.TrainingConfig(
    num_gpus=4,
    batch_size=32,
    learning_rate=1e-4,
    mixed_precision=True
)

# Start accelerated training
trainer = ace3.DistributedTrainer(config)
trainer.train(model, dataset)
'''
    namespace: dict[str, object] = {}
    exec(compile(snippet, "quick_start.py", "exec"), namespace)
    trainer = namespace["trainer"]
    job = trainer.last_job.refresh()  # type: ignore[attr-defined]
    assert job.state == "succeeded" and job.num_processes == 4
    assert job.config["mixed_precision"] is True
    client = namespace["client"]
    ranks = {line.rank for line in client.jobs.logs(job.id, limit=5000).data}  # type: ignore[attr-defined]
    assert {0, 1, 2, 3} <= ranks


def test_a_nan_loss_fails_the_job_naming_the_step_where_it_began(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    diverging = tmp_path / "diverging_model.py"
    diverging.write_text(
        "import torch\n\n\n"
        "class Diverging(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.linear = torch.nn.Linear(64, 10)\n"
        "        self.calls = 0\n\n"
        "    def forward(self, x):\n"
        "        self.calls += 1\n"
        "        out = self.linear(x)\n"
        "        return out * float('nan') if self.calls >= 3 and self.training else out\n\n\n"
        "def build_model():\n"
        "    return Diverging()\n"
    )
    with pytest.raises(ace3.JobFailedError) as failure:
        ace3.Trainer(ace3.TrainingConfig(batch_size=64, log_interval=5)).train(
            client.load_model(diverging),
            client.load_dataset(digits_files.train),
            epochs=1,
            show_progress=False,
        )
    job = failure.value.job
    assert job.state == "failed" and job.attempt == 1, "a diverged run is not retried"
    assert "training loss became nan at step 3 (reported at step 5)" in (job.error or "")
    notices = [line.line for line in client.jobs.iter_logs(job.id) if line.stream == "service"]
    assert "ace3: train_loss became nan at step 3" in notices
