"""The kind a dataset's records were named (``records=``) cannot change under a job: naming the
same bytes (a file, or the same shards) another kind while an unfinished job uses the dataset is
a 409 naming the job (the job was checked against the kind it was submitted with, and every
attempt reads the kind from the row), and is taken once the job finished. The
OpenAI-compatible files upload refuses bytes whose dataset was named text records."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import ace3
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job
from ace3_control.settings import Settings
from tests.conftest import insert_job
from tests.integration.server.in_process_api import add_key, serve

BOTH = {"prompt": "a", "completion": "b", "text": "a b"}  # (prompt/completion, or text)


def _jsonl(*records: dict[str, Any]) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


@pytest.fixture(scope="module")
def served(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[httpx.Client, str, str]]:
    """(an owner's HTTP client, its key, the id of a queued job of that owner)."""
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        job = insert_job(session, state="queued")
        key, _ = add_key(session, job.owner_id)
        job_id = job.id
    engine.dispose()
    settings = Settings(
        data_dir=Path(tmp_path_factory.mktemp("records-in-use")),
        database_url=database_url,
        broker_url=redis_url,
        queue_name=f"ace3-records-in-use-{secrets.token_hex(4)}",  # no worker reads it
    )
    with (
        serve(settings) as (_, base),
        httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as client,
    ):
        yield client, key, job_id


def _use(database_url: str, job_id: str, dataset_id: str, state: str) -> None:
    """The job (queued, or finished: ``state``) now trains on ``dataset_id``."""
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.dataset_id, job.state = dataset_id, state
        session.commit()
    engine.dispose()


def _upload(client: httpx.Client, data: bytes, **form: str) -> httpx.Response:
    return client.post("/v1/datasets", files={"file": ("both.jsonl", data)}, data=form)


def test_a_file_s_records_are_not_renamed_under_an_unfinished_job(
    served: tuple[httpx.Client, str, str], database_url: str
) -> None:
    client, _, job_id = served
    data = _jsonl(BOTH, BOTH)
    told = _upload(client, data)
    assert told.status_code == 201 and told.json()["records"] == "prompt_completion"
    _use(database_url, job_id, told.json()["id"], "queued")
    refused = _upload(client, data, records="text")
    assert refused.status_code == 409, refused.text
    assert job_id in refused.json()["detail"] and "prompt_completion" in refused.json()["detail"]
    assert client.get(f"/v1/datasets/{told.json()['id']}").json()["records"] == (
        "prompt_completion"
    )
    same = _upload(client, data, records="prompt_completion")  # (the same kind, named: taken)
    assert same.status_code == 200 and same.json()["records"] == "prompt_completion"
    _use(database_url, job_id, told.json()["id"], "succeeded")
    renamed = _upload(client, data, records="text")
    assert renamed.status_code == 200 and renamed.json()["records"] == "text"
    # the OpenAI-compatible upload of the same bytes does not return a dataset of text records
    openai = client.post(
        "/openai/v1/files", files={"file": ("both.jsonl", data)}, data={"purpose": "fine-tune"}
    )
    assert openai.status_code == 400, openai.text
    error = openai.json()["error"]
    assert error["param"] == "file" and "named text" in error["message"]


def test_the_same_shards_are_not_renamed_under_an_unfinished_job(
    served: tuple[httpx.Client, str, str], database_url: str, tmp_path: Path
) -> None:
    client, key, job_id = served
    (tmp_path / "0.jsonl").write_bytes(_jsonl(BOTH))
    with ace3.Client(api_key=key, base_url=str(client.base_url), max_retries=0) as sdk:
        first = sdk.load_dataset(tmp_path, format="jsonl", records="prompt_completion")
        _use(database_url, job_id, first.id, "running")
        with pytest.raises(ace3.errors.ConflictError, match=job_id):
            sdk.load_dataset(tmp_path, format="jsonl", records="text")
        assert sdk.datasets.retrieve(first.id).records == "prompt_completion"
        _use(database_url, job_id, first.id, "cancelled")
        assert sdk.load_dataset(tmp_path, format="jsonl", records="text").records == "text"
