"""The official ``openai`` package fine-tunes through the real stack (API, Postgres, Redis,
Celery worker, the job's sandbox): a tiny GPT-2 built from a config with a local tokenizer
(``test_language_models._gpt2_directory``, nothing downloaded) is uploaded with the ACE3 SDK,
prompt/completion records with ``files.create``; ``fine_tuning.jobs.create`` trains it with LoRA
for a few steps, the events are followed to ``succeeded``, the checkpoints listed, and the
``fine_tuned_model`` the worker registered is fine-tuned again by its id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import ace3
from tests.conftest import Stack
from tests.e2e.test_language_models import TEXT, _gpt2_directory

pytestmark = pytest.mark.slow
openai = pytest.importorskip("openai")


def _fine_tune(client: Any, sdk: ace3.Client, model: str, file_id: str) -> Any:
    job = client.fine_tuning.jobs.create(
        model=model, training_file=file_id, suffix="e2e", seed=0,
        hyperparameters={"batch_size": 4, "learning_rate_multiplier": 100},
        extra_body={"ace3": {"max_steps": 3, "log_interval": 1, "validation_split": 0.25}},
    )  # fmt: skip
    sdk.job(job.id).wait(timeout=600, show_progress=False)  # (the SDK follows its SSE stream)
    return client.fine_tuning.jobs.retrieve(job.id)


def test_the_openai_client_fine_tunes_and_fine_tunes_the_result_again(
    stack: Stack, tmp_path: Path
) -> None:
    key, _ = stack.create_key("openai-e2e")
    client = openai.OpenAI(base_url=f"{stack.base_url}/openai/v1", api_key=key, max_retries=0)
    source = tmp_path / "gpt2"
    _gpt2_directory(source)
    words = TEXT.split()
    records = [
        {"prompt": " ".join(words[i % 9 : i % 9 + 3]), "completion": " " + words[i % 9 + 3]}
        for i in range(32)
    ]
    data = "".join(json.dumps(record) + "\n" for record in records).encode()
    with ace3.Client(api_key=key, base_url=stack.base_url) as sdk:
        base_model = sdk.load_model(source).id
        training_file = client.files.create(file=("train.jsonl", data), purpose="fine-tune")

        job = _fine_tune(client, sdk, base_model, training_file.id)
        assert job.status == "succeeded", job.error
        assert job.hyperparameters.batch_size == 4 and job.finished_at is not None
        assert job.trained_tokens is not None and job.trained_tokens > 0
        events = client.fine_tuning.jobs.list_events(job.id, limit=100).data
        assert events[0].message.startswith("The job has successfully completed")
        steps = [e.data["step"] for e in events if e.type == "metrics"]
        assert steps == sorted(steps, reverse=True) and 3 in steps
        assert any("train_loss" in e.data for e in events if e.type == "metrics")
        checkpoints = client.fine_tuning.jobs.checkpoints.list(job.id).data
        assert checkpoints and checkpoints[0].step_number == 3
        assert checkpoints[0].fine_tuning_job_id == job.id
        (result,) = job.result_files
        header = client.files.content(result).read().decode().splitlines()[0]
        assert header.startswith("step,train_loss"), header

        # the worker registered the export as a model, named by the job: fine-tune it again
        assert job.fine_tuned_model is not None
        assert sdk.jobs.retrieve(job.id).fine_tuned_model_id == job.fine_tuned_model
        again = _fine_tune(client, sdk, job.fine_tuned_model, training_file.id)
        assert again.status == "succeeded", again.error
        assert again.model == job.fine_tuned_model and again.fine_tuned_model not in (
            None,
            job.fine_tuned_model,
        )
