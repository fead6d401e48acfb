"""Datasets by reference through the real API (in process, on a database of its own) and a real
S3 server (the session's SeaweedFS), whose one bucket holds both the artifact store
(``s3://<bucket>/ace3``) and the allowed sources: ``POST /v1/datasets/register`` of each
format, the allow-list and the store's own prefix refused naming ``uri``, the same listing
registered twice one dataset and a changed one another, the dataset's fields in GET and list,
another owner's 404, the job checks a streamed dataset needs, a delete that leaves the bucket
alone, and the SDK's ``client.datasets.register`` and the CLI's ``ace3 datasets``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import httpx
import pytest

import ace3
from ace3.cli import main
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.settings import Settings
from tests.conftest import fresh_database, insert_job
from tests.integration.server.in_process_api import add_key, serve
from tests.object_store import ObjectStore
from tests.shard_sources import (
    jsonl_bytes,
    new_bucket,
    parquet_bytes,
    put,
    s3_client,
    source_credentials,
    tar_bytes,
    tokens_bytes,
)


class API(NamedTuple):
    base_url: str
    owner: httpx.Client
    other: httpx.Client
    key: str
    model_id: str
    s3: Any
    bucket: str
    missing: str  # an allowed bucket that does not exist
    app: Any


@pytest.fixture(scope="module")
def api(
    object_store: ObjectStore, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[API]:
    s3 = s3_client(object_store)
    bucket = new_bucket(s3, "register")
    missing = f"missing-{secrets.token_hex(4)}"
    put(
        s3,
        bucket,
        {
            "allowed/pq/0.parquet": parquet_bytes(4),
            "allowed/pq/1.parquet": parquet_bytes(6),
            "allowed/pq/2.parquet": parquet_bytes(1),
            "allowed/js/a.jsonl": jsonl_bytes(3),
            "allowed/js/b.jsonl": jsonl_bytes(2),
            "allowed/wds/000.tar": tar_bytes(2),
            "allowed/tok/0.bin": tokens_bytes(64),
            "allowed/empty/readme.txt": b"no shards here",
            "elsewhere/0.jsonl": jsonl_bytes(1),
        },
    )
    with fresh_database() as database_url, source_credentials(object_store):
        engine = make_sync_engine(database_url)
        with sync_session_factory(engine)() as session:
            job = insert_job(session, state="cancelled")  # an owner with a model
            key, _ = add_key(session, job.owner_id)
            other_key, _ = add_key(session, insert_job(session, state="cancelled").owner_id)
            model_id = job.model_id
        engine.dispose()
        settings = Settings(
            data_dir=Path(tmp_path_factory.mktemp("register")),
            database_url=database_url,
            broker_url=redis_url,
            queue_name=f"ace3-register-{secrets.token_hex(4)}",  # no worker reads it
            storage_url=f"s3://{bucket}/ace3",
            s3_endpoint_url=object_store.endpoint_url,
            # the whole bucket is allowed: the store's own prefix in it is refused all the same
            dataset_sources=f"s3://{bucket}/, s3://{missing}/",
        )
        with (
            serve(settings) as (app, base_url),
            httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}) as owner,
            httpx.Client(
                base_url=base_url, headers={"Authorization": f"Bearer {other_key}"}
            ) as other,
        ):
            yield API(base_url, owner, other, key, model_id, s3, bucket, missing, app)


def _register(api: API, uri: str, format: str, **fields: Any) -> httpx.Response:
    return api.owner.post(
        "/v1/datasets/register", json={"uri": uri, "format": format, **fields}, timeout=60
    )


def _locs(response: httpx.Response) -> list[list[Any]]:
    assert response.status_code == 422, response.text
    return [error["loc"] for error in response.json()["detail"]]


def _message(response: httpx.Response) -> str:
    return " ".join(error["msg"] for error in response.json()["detail"])


def _job(api: API, client: httpx.Client, dataset_id: str, **config: Any) -> httpx.Response:
    body = {"model_id": api.model_id, "dataset_id": dataset_id, "config": config}
    return client.post("/v1/jobs", json=body)


def test_a_parquet_prefix_is_registered_with_its_row_counts(
    api: API, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ace3_control import dataset_sources

    monkeypatch.setattr(dataset_sources, "LIST_PAGE_SIZE", 2)  # three shards: two pages
    created = _register(api, f"s3://{api.bucket}/allowed/pq", "parquet", name="tables")
    assert created.status_code == 201, created.text
    dataset = created.json()
    assert dataset["kind"] == "remote" and dataset["format"] == "parquet"
    assert dataset["uri"] == f"s3://{api.bucket}/allowed/pq/"
    assert (dataset["shard_count"], dataset["samples"], dataset["name"]) == (3, 11, "tables")
    sizes = [
        api.s3.head_object(Bucket=api.bucket, Key=f"allowed/pq/{i}.parquet")["ContentLength"]
        for i in range(3)
    ]
    assert dataset["size_bytes"] == sum(sizes)
    shown = api.owner.get(f"/v1/datasets/{dataset['id']}").json()
    assert shown == dataset
    listed = api.owner.get("/v1/datasets", params={"sha256": dataset["sha256"]}).json()["data"]
    assert listed == [dataset]
    again = _register(api, f"s3://{api.bucket}/allowed/pq/", "parquet")
    assert again.status_code == 200 and again.json()["id"] == dataset["id"]


def test_each_stream_format_is_registered(api: API) -> None:
    jsonl = _register(api, f"s3://{api.bucket}/allowed/js/", "jsonl")
    assert jsonl.status_code == 201, jsonl.text
    assert (jsonl.json()["shard_count"], jsonl.json()["samples"]) == (2, None)
    tars = _register(api, f"s3://{api.bucket}/allowed/wds/", "webdataset").json()
    assert (tars["format"], tars["shard_count"], tars["samples"]) == ("webdataset", 1, None)
    tokens = _register(api, f"s3://{api.bucket}/allowed/tok/", "tokens").json()
    assert (tokens["size_bytes"], tokens["samples"]) == (128, None)
    wider = _register(api, f"s3://{api.bucket}/allowed/tok/", "tokens", dtype="uint32").json()
    assert wider["id"] != tokens["id"]  # another dtype, another manifest


def test_a_changed_listing_is_another_dataset(api: API) -> None:
    prefix = f"allowed/grow-{secrets.token_hex(3)}/"
    put(api.s3, api.bucket, {f"{prefix}0.jsonl": jsonl_bytes(2)})
    first = _register(api, f"s3://{api.bucket}/{prefix}", "jsonl").json()
    put(api.s3, api.bucket, {f"{prefix}1.jsonl": jsonl_bytes(2)})
    second = _register(api, f"s3://{api.bucket}/{prefix}", "jsonl")
    assert second.status_code == 201 and second.json()["id"] != first["id"]
    assert second.json()["shard_count"] == 2
    put(api.s3, api.bucket, {f"{prefix}1.jsonl": jsonl_bytes(3)})  # rewritten: a new ETag
    third = _register(api, f"s3://{api.bucket}/{prefix}", "jsonl")
    assert third.status_code == 201 and third.json()["sha256"] != second.json()["sha256"]


def test_what_may_not_be_read_is_refused_naming_uri(api: API) -> None:
    outside = _register(api, "s3://some-other-bucket/data/", "jsonl")
    assert _locs(outside) == [["body", "uri"]]
    assert "not under a dataset source" in _message(outside)
    for store in (
        f"s3://{api.bucket}/ace3/",
        f"s3://{api.bucket}/ace3/datasets/",
        f"s3://{api.bucket}/",
    ):
        refused = _register(api, store, "jsonl")
        assert _locs(refused) == [["body", "uri"]] and "own artifact store" in _message(refused)
    empty = _register(api, f"s3://{api.bucket}/allowed/empty/", "parquet")
    assert _locs(empty) == [["body", "uri"]] and "holds no parquet shards" in _message(empty)
    missing = _register(api, f"s3://{api.missing}/x/", "jsonl")
    assert _locs(missing) == [["body", "uri"]]
    assert "cannot be read by the service" in _message(missing)
    assert "NoSuchBucket" in _message(missing)


def test_fields_for_another_format_are_refused_naming_them(api: API) -> None:
    uri = f"s3://{api.bucket}/allowed/js/"
    assert _locs(_register(api, uri, "jsonl", dtype="uint16")) == [["body", "dtype"]]
    assert _locs(_register(api, uri, "jsonl", columns={"inputs": "x"})) == [["body", "columns"]]
    assert _locs(_register(api, uri, "csv")) == [["body", "format"]]
    named = _register(api, f"s3://{api.bucket}/allowed/pq/", "parquet", columns={"inputs": "x"})
    assert _locs(named) == [["body", "columns"]] and "no column 'x'" in _message(named)
    assert _locs(_register(api, "not a uri", "jsonl")) == [["body", "uri"]]


def test_another_owner_cannot_see_or_train_on_the_dataset(api: API) -> None:
    dataset = _register(api, f"s3://{api.bucket}/allowed/pq/", "parquet").json()
    assert api.other.get(f"/v1/datasets/{dataset['id']}").status_code == 404
    assert api.other.delete(f"/v1/datasets/{dataset['id']}").status_code == 404
    refused = _job(api, api.other, dataset["id"], max_steps=2)
    assert ["body", "dataset_id"] in _locs(refused)
    listed = api.other.get("/v1/datasets").json()["data"]
    assert all(item["id"] != dataset["id"] for item in listed)


def test_a_job_on_a_stream_needs_what_the_stream_cannot_tell(api: API) -> None:
    tokens = _register(api, f"s3://{api.bucket}/allowed/tok/", "tokens").json()["id"]
    jsonl = _register(api, f"s3://{api.bucket}/allowed/js/", "jsonl").json()["id"]
    parquet = _register(api, f"s3://{api.bucket}/allowed/pq/", "parquet").json()["id"]
    no_length = _job(api, api.owner, tokens, max_steps=2)
    assert _locs(no_length) == [["body", "config", "sequence_length"]]
    assert _job(api, api.owner, tokens, max_steps=2, sequence_length=8).status_code == 201
    with_epochs = _job(api, api.owner, jsonl, epochs=2)
    assert _locs(with_epochs) == [["body", "config", "epochs"]]
    assert "sample count of jsonl shards is not recorded" in _message(with_epochs)
    neither = _job(api, api.owner, jsonl)
    assert _locs(neither) == [["body", "config", "max_steps"]]
    assert _job(api, api.owner, jsonl, max_steps=3).status_code == 201
    assert _job(api, api.owner, parquet, epochs=2).status_code == 201  # rows are counted
    as_validation = api.owner.post(
        "/v1/jobs",
        json={"model_id": api.model_id, "dataset_id": parquet, "validation_dataset_id": tokens,
              "config": {"epochs": 1}},
    )  # fmt: skip
    assert _locs(as_validation) == [["body", "config", "sequence_length"]]


def test_deleting_a_remote_dataset_leaves_the_bucket_alone(api: API) -> None:
    prefix = f"allowed/keep-{secrets.token_hex(3)}/"
    put(api.s3, api.bucket, {f"{prefix}0.jsonl": jsonl_bytes(2)})
    dataset = _register(api, f"s3://{api.bucket}/{prefix}", "jsonl").json()
    assert api.owner.delete(f"/v1/datasets/{dataset['id']}").status_code == 204
    assert api.owner.get(f"/v1/datasets/{dataset['id']}").status_code == 404
    listed = api.s3.list_objects_v2(Bucket=api.bucket, Prefix=prefix)["Contents"]
    assert [item["Key"] for item in listed] == [f"{prefix}0.jsonl"]
    revived = _register(api, f"s3://{api.bucket}/{prefix}", "jsonl")
    assert revived.status_code == 201 and revived.json()["id"] == dataset["id"]


def test_the_sdk_registers_a_dataset_ref_and_raises_the_typed_error(api: API) -> None:
    with ace3.Client(api_key=api.key, base_url=api.base_url, max_retries=0) as client:
        first = client.datasets.register(f"s3://{api.bucket}/allowed/js/", format="jsonl")
        ref = client.datasets.register(f"s3://{api.bucket}/allowed/js", format="jsonl")
        assert isinstance(ref, ace3.DatasetRef) and ref.client is client and ref.id == first.id
        assert (ref.dataset.kind, ref.dataset.shard_count, ref.dataset.samples) == (
            "remote",
            2,
            None,
        )
        assert ref.dataset.uri == f"s3://{api.bucket}/allowed/js/"
        assert not ref.uploaded  # registered before: the same dataset
        assert client.datasets.retrieve(ref.id).uri == ref.dataset.uri
        job = client.jobs.create(
            model_id=api.model_id, dataset_id=ref.id, config=ace3.TrainingConfig(max_steps=2)
        )
        assert job.dataset_id == ref.id
        with pytest.raises(ace3.ValidationError) as caught:
            client.datasets.register("s3://some-other-bucket/x/", format="parquet")
        assert [error["loc"] for error in caught.value.errors] == [["body", "uri"]]
        assert "uri: s3://some-other-bucket/x/ is not under a dataset source" in str(caught.value)
        with pytest.raises(ace3.ValidationError, match="sequence_length"):
            tokens = client.datasets.register(f"s3://{api.bucket}/allowed/tok/", format="tokens")
            client.jobs.create(
                model_id=api.model_id, dataset_id=tokens.id, config=ace3.TrainingConfig(max_steps=2)
            )


def _cli(api: API, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = {"ACE3_API_KEY": api.key, "ACE3_BASE_URL": api.base_url}
    with (
        mock.patch.dict(os.environ, env),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = main(list(args))
        except SystemExit as exc:  # (argparse's usage errors)
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_the_cli_registers_lists_and_shows_datasets(api: API) -> None:
    uri = f"s3://{api.bucket}/allowed/pq/"
    code, out, err = _cli(api, "datasets", "register", uri, "--format", "parquet", "--json")
    assert code == 0, err
    registered = json.loads(out)
    assert (registered["kind"], registered["samples"]) == ("remote", 11)
    code, out, err = _cli(api, "datasets", "show", registered["id"])
    assert code == 0, err
    for shown in ("remote", uri, "parquet", "shards", "3", str(registered["size_bytes"]), "11"):
        assert shown in out, out
    code, out, err = _cli(api, "datasets", "list", "--json")
    assert code == 0 and registered["id"] in {item["id"] for item in json.loads(out)}
    code, out, err = _cli(api, "datasets", "list")
    assert code == 0 and registered["id"] in out
    code, out, err = _cli(
        api, "datasets", "register", "s3://some-other-bucket/x/", "--format", "jsonl"
    )
    assert code != 0 and "not under a dataset source" in err
    code, out, err = _cli(
        api, "datasets", "register", uri, "--format", "parquet", "--column", "labels=y"
    )
    assert code == 2  # (argparse's usage error)


def test_a_registration_past_its_deadline_or_one_too_many_is_refused(
    api: API, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from ace3_server.services import dataset_registry

    uri = f"s3://{api.bucket}/allowed/js/"
    monkeypatch.setattr(api.app.state.settings, "dataset_listing_seconds", 1e-9)
    late = _register(api, uri, "jsonl")
    assert _locs(late) == [["body", "uri"]] and "ACE3_DATASET_LISTING_SECONDS" in _message(late)
    monkeypatch.undo()
    busy = threading.BoundedSemaphore(1)
    busy.acquire()  # another registration lists now: the most this process lists at once
    monkeypatch.setattr(dataset_registry, "_registrations", busy)
    refused = _register(api, uri, "jsonl")
    assert refused.status_code == 429 and refused.headers["retry-after"]
    busy.release()
    assert _register(api, uri, "jsonl").status_code in (200, 201)
