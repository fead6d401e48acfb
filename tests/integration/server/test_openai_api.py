"""The OpenAI-compatible API (``/openai/v1``) driven by the official ``openai`` package against
an API of its own (jobs stay queued: no worker reads its queue): files, fine-tuning jobs, their
listing, cancellation, events, result files, another owner's view and OpenAI's error shapes and
statuses."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ace3
from ace3_server.openai_api.results import HEADER
from tests.integration.server.in_process_api import Served, serve, serve_owners

openai = pytest.importorskip("openai")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

RECORDS = [{"prompt": f"count {i}", "completion": f" {i + 1}"} for i in range(16)]


def _jsonl(records: list[Any]) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


@pytest.fixture(scope="module")
def served(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data_dir = Path(tmp_path_factory.mktemp("openai"))
    with serve_owners(redis_url, data_dir, "openai", owners=2) as served:
        yield served


@pytest.fixture(scope="module")
def api(served: Served) -> tuple[str, str]:
    return served.base, served.keys[0]


def _client(base: str, key: str) -> Any:
    return openai.OpenAI(base_url=f"{base}/openai/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def client(api: tuple[str, str]) -> Any:
    return _client(*api)


@pytest.fixture(scope="module")
def other_owner(served: Served) -> Any:
    """The client of a second owner of the same API."""
    return _client(served.base, served.keys[1])


@pytest.fixture(scope="module")
def model_id(api: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    from tests.e2e.test_language_models import _gpt2_directory

    directory = tmp_path_factory.mktemp("gpt2")
    _gpt2_directory(directory)
    base, key = api
    with ace3.Client(api_key=key, base_url=base) as sdk:
        return sdk.load_model(directory, name="tiny-gpt2").id


@pytest.fixture(scope="module")
def training_file(client: Any) -> Any:
    return client.files.create(file=("train.jsonl", _jsonl(RECORDS)), purpose="fine-tune")


def test_a_file_is_uploaded_read_back_and_listed(client: Any, training_file: Any) -> None:
    assert training_file.object == "file" and training_file.status == "processed"
    assert (training_file.filename, training_file.purpose) == ("train.jsonl", "fine-tune")
    assert training_file.bytes == len(_jsonl(RECORDS)) and training_file.created_at > 0
    assert client.files.retrieve(training_file.id).id == training_file.id
    assert client.files.content(training_file.id).read() == _jsonl(RECORDS)
    assert training_file.id in [f.id for f in client.files.list().data]


def test_a_file_of_other_records_is_refused_naming_the_line(client: Any) -> None:
    pairs = b"\n" + _jsonl([{"inputs": [1.0, 2.0], "target": 1}])
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("pairs.jsonl", pairs), purpose="fine-tune")
    assert "line 2" in refused.value.message and "prompt/completion" in refused.value.message
    assert refused.value.param == "file"
    broken = _jsonl([RECORDS[0], {"prompt": "a", "completion": 3}])
    with pytest.raises(openai.BadRequestError, match="line 2: 'completion' must be a string"):
        client.files.create(file=("broken.jsonl", io.BytesIO(broken)), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("train.jsonl", _jsonl(RECORDS)), purpose="assistants")


def test_a_chat_file_with_tool_calls_is_taken_and_a_malformed_call_refused(client: Any) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    chat = {
        "messages": [
            {"role": "user", "content": "1 + 1?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "2"},
            {"role": "assistant", "content": "2"},
        ],
        "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}],
    }
    taken = client.files.create(file=("tools.jsonl", _jsonl([chat])), purpose="fine-tune")
    assert taken.status == "processed"
    no_name = {**call, "function": {"arguments": "{}"}}
    bad = {"messages": [chat["messages"][0], {"role": "assistant", "tool_calls": [no_name]}]}
    with pytest.raises(openai.BadRequestError, match=r"line 2: messages\[1\]\.tool_calls\[0\]"):
        client.files.create(file=("bad.jsonl", _jsonl([chat, bad])), purpose="fine-tune")
    # OpenAI's own dumps: "tool_calls": null; a weight (0 or 1) on an assistant message.
    dumped = {"role": "assistant", "content": "2", "tool_calls": None, "weight": 0}
    weighted = {"messages": [*chat["messages"][:3], dumped, *chat["messages"][2:]]}
    taken = client.files.create(file=("w.jsonl", _jsonl([weighted])), purpose="fine-tune")
    assert taken.status == "processed"
    bad = {"messages": [chat["messages"][0], {**dumped, "weight": 2}]}
    with pytest.raises(openai.BadRequestError, match=r"line 2: messages\[1\]\.weight must be"):
        client.files.create(file=("bad.jsonl", _jsonl([chat, bad])), purpose="fine-tune")


def _create(client: Any, model: str, file_id: str, **extra: Any) -> Any:
    return client.fine_tuning.jobs.create(model=model, training_file=file_id, **extra)


def test_a_job_is_an_ace3_job_with_the_hyperparameters_mapped(
    client: Any, api: tuple[str, str], model_id: str, training_file: Any
) -> None:
    job = _create(
        client, "tiny-gpt2", training_file.id, suffix="counting", seed=7,
        metadata={"team": "nlp"}, validation_file=training_file.id,
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 0.5}}},
        extra_body={"ace3": {"max_steps": 5, "log_interval": 1}},
    )  # fmt: skip
    assert (job.object, job.status, job.model) == ("fine_tuning.job", "queued", "tiny-gpt2")
    assert job.hyperparameters.n_epochs == 2 and job.hyperparameters.batch_size == 4
    assert job.hyperparameters.learning_rate_multiplier == 0.5
    assert (job.seed, job.user_provided_suffix, job.metadata) == (7, "counting", {"team": "nlp"})
    assert (job.training_file, job.validation_file) == (training_file.id, training_file.id)
    assert job.fine_tuned_model is None and job.result_files == [] and job.error is None
    base, key = api
    with ace3.Client(api_key=key, base_url=base) as sdk:
        same = sdk.jobs.retrieve(job.id)
    assert same.model_id == model_id and same.config["max_steps"] == 5
    assert same.config["learning_rate"] == pytest.approx(1e-4)  # 0.5 x the LoRA base, 2e-4
    assert same.config["lora"]["target_modules"] == "all-linear"
    assert client.fine_tuning.jobs.retrieve(job.id).metadata == {"team": "nlp"}
    events = client.fine_tuning.jobs.list_events(job.id).data
    assert [e.message for e in events] == [f"Created fine-tuning job: {job.id}"]
    assert client.fine_tuning.jobs.checkpoints.list(job.id).data == []


def test_jobs_are_listed_newest_first_in_pages(
    client: Any, model_id: str, training_file: Any
) -> None:
    made = [_create(client, model_id, training_file.id).id for _ in range(3)]
    first = client.fine_tuning.jobs.list(limit=2)
    assert [job.id for job in first.data] == made[::-1][:2] and first.has_more
    rest = client.fine_tuning.jobs.list(limit=2, after=first.data[-1].id)
    assert rest.data[0].id == made[0]
    assert set(made) <= {job.id for job in client.fine_tuning.jobs.list(limit=100).data}


def test_a_job_is_cancelled_once_and_its_metrics_file_is_readable(
    client: Any, model_id: str, training_file: Any
) -> None:
    job = _create(client, model_id, training_file.id)
    cancelled = client.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    with pytest.raises(openai.BadRequestError, match="cancelled already"):
        client.fine_tuning.jobs.cancel(job.id)
    (result,) = cancelled.result_files
    assert client.files.retrieve(result).purpose == "fine-tune-results"
    assert client.files.content(result).read().decode().splitlines() == [HEADER.strip()]
    messages = [e.message for e in client.fine_tuning.jobs.list_events(job.id).data]
    assert messages == ["The job was cancelled", f"Created fine-tuning job: {job.id}"]
    older = client.fine_tuning.jobs.list_events(job.id, limit=1)
    assert older.has_more
    after = client.fine_tuning.jobs.list_events(job.id, after=older.data[0].id).data
    assert [e.message for e in after] == [f"Created fine-tuning job: {job.id}"]


def test_refusals_have_openais_shape_and_status(
    client: Any, api: tuple[str, str], model_id: str, training_file: Any
) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        _create(client, "no-such-model", training_file.id)
    assert missing.value.param == "model" and missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError, match="no file"):
        _create(client, model_id, "0" * 32)
    with pytest.raises(openai.BadRequestError, match="'warmup_ratio'") as unknown:
        _create(client, model_id, training_file.id, hyperparameters={"warmup_ratio": 0.1})
    assert unknown.value.param == "hyperparameters.warmup_ratio"
    with pytest.raises(openai.BadRequestError) as bad_field:
        _create(client, model_id, training_file.id, extra_body={"ace3": {"not_a_field": 1}})
    assert bad_field.value.param == "ace3.not_a_field"
    with pytest.raises(openai.BadRequestError) as method:
        _create(client, model_id, training_file.id, method={"type": "dpo"})
    assert method.value.param == "method.type"
    with pytest.raises(openai.BadRequestError) as epochs:  # out of OpenAI's range, named so
        _create(client, model_id, training_file.id, hyperparameters={"n_epochs": 10**12})
    assert epochs.value.param == "hyperparameters.n_epochs"
    with pytest.raises(openai.BadRequestError) as metadata:
        _create(client, model_id, training_file.id, metadata={"note": "x" * 513})
    assert metadata.value.param == "metadata" and "512" in metadata.value.message
    with pytest.raises(openai.NotFoundError):
        client.fine_tuning.jobs.retrieve("0" * 32)
    base, _ = api
    stranger = openai.OpenAI(base_url=f"{base}/openai/v1", api_key="ace3_bad", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as denied:
        stranger.fine_tuning.jobs.list()
    assert denied.value.code == "invalid_api_key" and denied.value.type == "invalid_request_error"
    with pytest.raises(openai.AuthenticationError) as upload:  # refused before the body is read
        stranger.files.create(file=("train.jsonl", _jsonl(RECORDS)), purpose="fine-tune")
    assert upload.value.code == "invalid_api_key"


def test_an_idempotency_key_replays_the_same_request_and_refuses_another(
    client: Any, model_id: str, training_file: Any
) -> None:
    headers = {"Idempotency-Key": "openai-replay"}
    first = _create(client, model_id, training_file.id, suffix="a", extra_headers=headers)
    again = _create(client, model_id, training_file.id, suffix="a", extra_headers=headers)
    assert again.id == first.id
    with pytest.raises(openai.ConflictError):  # the same key, another suffix: not a replay
        _create(client, model_id, training_file.id, suffix="b", extra_headers=headers)
    client.fine_tuning.jobs.cancel(first.id)


def test_another_owner_gets_openais_404_for_everything_of_the_first(
    client: Any, other_owner: Any, model_id: str, training_file: Any
) -> None:
    job = _create(client, model_id, training_file.id)
    (result,) = client.fine_tuning.jobs.cancel(job.id).result_files
    jobs = other_owner.fine_tuning.jobs
    refused = [
        lambda: other_owner.files.retrieve(training_file.id),
        lambda: other_owner.files.content(training_file.id),
        lambda: other_owner.files.delete(training_file.id),
        lambda: other_owner.files.retrieve(result),
        lambda: other_owner.files.content(result),
        lambda: jobs.retrieve(job.id),
        lambda: jobs.cancel(job.id),
        lambda: jobs.list_events(job.id),
        lambda: jobs.checkpoints.list(job.id),
        lambda: _create(other_owner, model_id, "0" * 32),  # the first owner's model by id
        lambda: _create(other_owner, "tiny-gpt2", "0" * 32),  # ... and by name
        lambda: _create(other_owner, "0" * 32, training_file.id),  # ... the first's file
    ]
    for call in refused:
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        body = missing.value.body
        assert set(body) == {"message", "type", "param", "code"}, body
        assert missing.value.type == "invalid_request_error"
    assert client.files.retrieve(training_file.id).id == training_file.id  # still there
    assert training_file.id not in [f.id for f in other_owner.files.list().data]
    assert job.id not in [j.id for j in jobs.list().data]


def test_an_upload_over_the_cap_is_a_413_in_openais_shape(served: Served) -> None:
    capped = served.settings.model_copy(update={"max_upload_bytes": 1024})
    with serve(capped) as (_, base), pytest.raises(openai.APIStatusError) as refused:
        _client(base, served.keys[0]).files.create(
            file=("big.jsonl", _jsonl(RECORDS) * 8), purpose="fine-tune"
        )
    assert refused.value.status_code == 413
    assert (refused.value.type, refused.value.code) == ("invalid_request_error", "file_too_large")


def _insert(served: Served, rows: list[Any]) -> None:
    from ace3_control.db import make_sync_engine, sync_session_factory

    engine = make_sync_engine(served.database_url)
    with sync_session_factory(engine)() as session:
        session.add_all(rows)
        session.commit()
    engine.dispose()


def test_the_result_file_has_bounded_columns_in_pages_and_its_size(
    client: Any, served: Served, model_id: str, training_file: Any, monkeypatch: Any
) -> None:
    from ace3_control.models import JobMetric
    from ace3_server.openai_api import results

    job = _create(client, model_id, training_file.id)
    (result,) = client.fine_tuning.jobs.cancel(job.id).result_files
    named = {"train_loss": 2.5, "val_loss": -1.25, "learning_rate": 1e-05, "=HYPERLINK()": 1.0}
    invented = {f"made_up_{i}": float(i) for i in range(40)}  # no column each
    _insert(served, [
        JobMetric(job_id=job.id, step=step, name=name, value=value)
        for step in (1, 2, 10) for name, value in {**named, **invented}.items()
    ])  # fmt: skip
    monkeypatch.setattr(results, "PAGE_ROWS", 2)  # a step's values span pages
    content = client.files.content(result).read()
    lines = content.decode().splitlines()
    assert lines[0] == (
        "step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy,"
        "val_perplexity,learning_rate,tokens_per_sec"
    )
    assert lines[1:] == [f"{step},2.5,,-1.25,,,1e-05," for step in (1, 2, 10)]
    assert client.files.retrieve(result).bytes == len(content)


def test_events_page_through_logs_and_metrics_without_repeats(
    client: Any, served: Served, model_id: str, training_file: Any
) -> None:
    from ace3_control.models import JobLog, JobMetric

    job = _create(client, model_id, training_file.id)
    rows: list[Any] = []
    for step in range(1, 6):
        rows.append(JobMetric(job_id=job.id, step=step, name="train_loss", value=1.0 / step))
        rows.append(JobLog(job_id=job.id, attempt=1, rank=0, stream="stdout", line=f"log {step}"))
    _insert(served, rows)
    client.fine_tuning.jobs.cancel(job.id)
    everything = client.fine_tuning.jobs.list_events(job.id, limit=100)
    assert not everything.has_more and len(everything.data) == 12  # 5 + 5 + created, cancelled
    seen, after = [], None
    while True:
        page = client.fine_tuning.jobs.list_events(
            job.id, limit=3, **({"after": after} if after else {})
        )
        seen += page.data
        if not page.has_more:
            break
        after = page.data[-1].id
    assert [e.id for e in seen] == [e.id for e in everything.data]
    assert sorted(e.message for e in seen if e.type == "metrics")[0] == "Step 1: train_loss=1"
    with pytest.raises(openai.BadRequestError) as bad:
        client.fine_tuning.jobs.list_events(job.id, after="ftevent-log-1")
    assert bad.value.param == "after"
