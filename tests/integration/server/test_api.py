"""The REST API over plain HTTP against the real server, Postgres and Redis: auth and owner
isolation, uploads (dedup, caps, validation), job creation (validation, idempotency), listing."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import MAX_UPLOAD_BYTES, DigitsFiles, Stack


@pytest.fixture(scope="module")
def owner(stack: Stack) -> Iterator[httpx.Client]:
    key, _ = stack.create_key("api-owner")
    with httpx.Client(
        base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        yield client


@pytest.fixture(scope="module")
def other_owner(stack: Stack) -> Iterator[httpx.Client]:
    key, _ = stack.create_key("someone-else")
    with httpx.Client(
        base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        yield client


@pytest.fixture(scope="module")
def uploaded(owner: httpx.Client, digits_files: DigitsFiles) -> dict[str, str]:
    model = owner.post("/v1/models", files={"file": ("model.py", digits_files.model.read_bytes())})
    dataset = owner.post(
        "/v1/datasets", files={"file": ("train.npz", digits_files.train.read_bytes())}
    )
    assert model.status_code in (200, 201) and dataset.status_code in (200, 201)
    return {"model_id": model.json()["id"], "dataset_id": dataset.json()["id"]}


def _queued_messages(stack: Stack) -> int:
    client = redis.Redis.from_url(stack.env["ACE3_BROKER_URL"])
    try:
        return int(client.llen(stack.env["ACE3_QUEUE_NAME"]))
    finally:
        client.close()


def _storage_files(stack: Stack) -> list[Path]:
    root = stack.root / "storage"
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def _wait_for_state(client: httpx.Client, job_id: str, state: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get(f"/v1/jobs/{job_id}").json()["state"] == state:
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not reach {state} in {timeout} s")


# -- auth -----------------------------------------------------------------------------------------
def _wait_until_ended(client: httpx.Client, job_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while client.get(f"/v1/jobs/{job_id}").json()["finished_at"] is None:
        assert time.monotonic() < deadline, f"job {job_id} did not end in {timeout} s"
        time.sleep(0.2)


def test_missing_unknown_and_revoked_keys_get_the_same_401(stack: Stack) -> None:
    key, _ = stack.create_key("to-revoke")
    prefix = key.split("_")[1]
    assert stack.cli("keys", "revoke", prefix).returncode == 0
    responses = [
        httpx.get(f"{stack.base_url}/v1/jobs"),
        httpx.get(
            f"{stack.base_url}/v1/jobs", headers={"Authorization": "Bearer ace3_000000000000_nope"}
        ),
        httpx.get(f"{stack.base_url}/v1/jobs", headers={"Authorization": "Bearer garbage"}),
        httpx.get(f"{stack.base_url}/v1/jobs", headers={"Authorization": f"Bearer {key}"}),
    ]
    assert [r.status_code for r in responses] == [401] * 4
    assert len({r.json()["detail"] for r in responses}) == 1


def test_keys_are_listed_by_prefix_only(stack: Stack) -> None:
    key, _ = stack.create_key("listed")
    listing = stack.cli("keys", "list")
    assert listing.returncode == 0
    assert key.split("_")[1] in listing.stdout and key not in listing.stdout


def test_a_second_key_for_the_same_owner_sees_the_same_resources(
    stack: Stack, owner: httpx.Client, uploaded: dict[str, str]
) -> None:
    _, owner_id = stack.create_key("first-of-two")
    key_a, _ = stack.create_key("a", owner=owner_id)
    key_b, same_owner = stack.create_key("b", owner=owner_id)
    assert same_owner == owner_id
    files = {"file": ("shared.py", b"def build_model():\n    pass\n")}
    created = httpx.post(
        f"{stack.base_url}/v1/models", files=files, headers={"Authorization": f"Bearer {key_a}"}
    )
    seen = httpx.get(
        f"{stack.base_url}/v1/models/{created.json()['id']}",
        headers={"Authorization": f"Bearer {key_b}"},
    )
    assert seen.status_code == 200


# -- models and datasets ----------------------------------------------------------------------------
def test_the_same_model_bytes_are_stored_once(
    owner: httpx.Client, digits_files: DigitsFiles
) -> None:
    body = digits_files.model.read_bytes() + b"\n# variant for the dedup test\n"
    first = owner.post("/v1/models", files={"file": ("m.py", body)}, data={"name": "first"})
    again = owner.post("/v1/models", files={"file": ("other-name.py", body)})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    listed = owner.get("/v1/models", params={"sha256": first.json()["sha256"]}).json()["data"]
    assert [m["id"] for m in listed] == [first.json()["id"]]


def test_the_same_bytes_with_another_factory_are_another_model(owner: httpx.Client) -> None:
    body = b"import torch\nclass Net(torch.nn.Linear):\n    pass\ndef build_model():\n    return Net(4, 2)\n"
    by_function = owner.post("/v1/models", files={"file": ("two.py", body)})
    by_class = owner.post("/v1/models", files={"file": ("two.py", body)}, data={"factory": "Net"})
    assert (by_function.status_code, by_class.status_code) == (201, 201)
    assert by_function.json()["id"] != by_class.json()["id"]
    assert (by_function.json()["factory"], by_class.json()["factory"]) == ("build_model", "Net")
    owner.delete(f"/v1/models/{by_class.json()['id']}")
    assert owner.get(f"/v1/models/{by_function.json()['id']}").status_code == 200


def test_another_owners_resources_are_404(
    owner: httpx.Client, other_owner: httpx.Client, uploaded: dict[str, str]
) -> None:
    assert other_owner.get(f"/v1/models/{uploaded['model_id']}").status_code == 404
    assert other_owner.get(f"/v1/datasets/{uploaded['dataset_id']}").status_code == 404
    assert other_owner.delete(f"/v1/models/{uploaded['model_id']}").status_code == 404
    assert uploaded["model_id"] not in [
        m["id"] for m in other_owner.get("/v1/models").json()["data"]
    ]
    job = owner.post("/v1/jobs", json={**uploaded, "config": {"epochs": 1}})
    assert job.status_code == 201
    job_id = job.json()["id"]
    for path in ("", "/metrics", "/logs", "/checkpoints", "/events"):
        assert other_owner.get(f"/v1/jobs/{job_id}{path}").status_code == 404, path
    assert other_owner.post(f"/v1/jobs/{job_id}/cancel").status_code == 404
    assert job_id not in [j["id"] for j in other_owner.get("/v1/jobs").json()["data"]]
    # Using another owner's model in a job is the same as naming a model that does not exist.
    theirs = other_owner.post("/v1/jobs", json={**uploaded, "config": {}})
    assert theirs.status_code == 422
    assert {tuple(e["loc"]) for e in theirs.json()["detail"]} == {
        ("body", "model_id"),
        ("body", "dataset_id"),
    }
    owner.post(f"/v1/jobs/{job_id}/cancel")
    _wait_until_ended(owner, job_id)  # (the next tests compare this owner's job list)


def test_a_url_for_a_dataset_id_says_what_the_api_takes(
    owner: httpx.Client, uploaded: dict[str, str]
) -> None:
    response = owner.post(
        "/v1/jobs", json={**uploaded, "dataset_id": "s3://my-bucket/train", "config": {}}
    )
    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "dataset_id"]
    assert "'s3://my-bucket/train': it is a URL" in error["msg"]
    assert "client.load_dataset(local_path)" in error["msg"]


def test_invalid_python_is_refused_with_the_line(owner: httpx.Client) -> None:
    response = owner.post("/v1/models", files={"file": ("broken.py", b"def build_model(:\n")})
    assert response.status_code == 422
    error = response.json()["detail"][0]
    assert error["loc"] == ["body", "file"] and "not valid Python" in error["msg"]


def test_a_model_archive_needs_its_entry_module(owner: httpx.Client) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b"def build_model():\n    pass\n"
        info = tarfile.TarInfo("mypkg/model.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    archive = buffer.getvalue()
    missing = owner.post("/v1/models", files={"file": ("pkg.tar.gz", archive)})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == [
        "body",
        "entry_module",
    ]
    wrong = owner.post(
        "/v1/models", files={"file": ("pkg.tar.gz", archive)}, data={"entry_module": "mypkg.nope"}
    )
    assert wrong.status_code == 422 and "no module 'mypkg.nope'" in wrong.json()["detail"][0]["msg"]
    ok = owner.post(
        "/v1/models", files={"file": ("pkg.tar.gz", archive)}, data={"entry_module": "mypkg.model"}
    )
    assert ok.status_code == 201 and ok.json()["kind"] == "archive"


def test_unsupported_dataset_formats_are_refused(owner: httpx.Client) -> None:
    response = owner.post("/v1/datasets", files={"file": ("data.xlsx", b"PK...")})
    assert response.status_code == 422
    assert ".csv" in response.json()["detail"][0]["msg"]


def test_a_directory_archive_that_escapes_is_refused_and_nothing_is_stored(
    stack: Stack, owner: httpx.Client
) -> None:
    before = _storage_files(stack)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../../evil.csv")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"a,b"))
    response = owner.post(
        "/v1/datasets", files={"file": ("d.tar.gz", buffer.getvalue())}, data={"kind": "directory"}
    )
    assert response.status_code == 422 and "not allowed" in response.json()["detail"][0]["msg"]
    assert _storage_files(stack) == before


def test_an_upload_over_the_cap_is_413_and_nothing_is_stored(
    stack: Stack, owner: httpx.Client
) -> None:
    before = _storage_files(stack)
    listed_before = owner.get("/v1/datasets").json()["data"]
    too_big = b"0" * (MAX_UPLOAD_BYTES + 1)
    response = owner.post("/v1/datasets", files={"file": ("big.csv", too_big)})
    assert response.status_code == 413
    assert "ACE3_MAX_UPLOAD_BYTES" in response.json()["detail"]
    assert owner.get("/v1/datasets").json()["data"] == listed_before
    assert _storage_files(stack) == before


def test_an_upload_just_under_the_cap_is_accepted(owner: httpx.Client) -> None:
    header = b"x,target\n"
    body = header + b"1,0\n" * ((MAX_UPLOAD_BYTES - len(header)) // 4)
    assert len(body) <= MAX_UPLOAD_BYTES
    assert owner.post("/v1/datasets", files={"file": ("edge.csv", body)}).status_code == 201


# -- jobs -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"learning_rate": -1}, "learning_rate"),
        ({"batch_size": 0}, "batch_size"),
        ({"num_gpus": "four"}, "num_gpus"),
        ({"optimizer": "adagrad"}, "optimizer"),
        ({"optimizer": "Adadelta", "optimizer_kwargs": {"betas": [0.9, 0.99]}}, "optimizer_kwargs"),
        ({"leraning_rate": 0.1}, "leraning_rate"),
    ],
)
def test_an_invalid_config_is_422_naming_the_field_and_nothing_is_queued(
    stack: Stack,
    owner: httpx.Client,
    uploaded: dict[str, str],
    config: dict[str, object],
    field: str,
) -> None:
    jobs_before = owner.get("/v1/jobs").json()["data"]
    response = owner.post("/v1/jobs", json={**uploaded, "config": config})
    assert response.status_code == 422
    assert ["body", "config", field] in [e["loc"] for e in response.json()["detail"]]
    assert owner.get("/v1/jobs").json()["data"] == jobs_before
    assert _queued_messages(stack) == 0


def test_a_setting_the_engine_lacks_is_refused_not_ignored(
    owner: httpx.Client, uploaded: dict[str, str]
) -> None:
    response = owner.post(
        "/v1/jobs",
        json={**uploaded, "config": {"zero_stage": 2, "optimizer": "adam8bit"}},
    )
    assert response.status_code == 422
    errors = {e["loc"][-1]: e for e in response.json()["detail"]}
    assert set(errors) == {"optimizer"}
    assert all(
        e["type"] == "unsupported" and "not implemented" in e["msg"] for e in errors.values()
    )


def test_batch_size_must_split_across_processes(
    owner: httpx.Client, uploaded: dict[str, str]
) -> None:
    response = owner.post(
        "/v1/jobs", json={**uploaded, "config": {"num_gpus": 2, "batch_size": 33}}
    )
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "config", "batch_size"] and "batch_size (33)" in error["msg"]


def test_idempotency_key_replays_and_conflicts(
    owner: httpx.Client, uploaded: dict[str, str]
) -> None:
    body = {**uploaded, "config": {"epochs": 1}, "name": "idempotent"}
    headers = {"Idempotency-Key": "key-123"}
    first = owner.post("/v1/jobs", json=body, headers=headers)
    replay = owner.post("/v1/jobs", json=body, headers=headers)
    assert (first.status_code, replay.status_code) == (201, 200)
    assert first.json()["id"] == replay.json()["id"]
    conflict = owner.post("/v1/jobs", json={**body, "name": "changed"}, headers=headers)
    assert conflict.status_code == 409 and "Idempotency-Key" in conflict.json()["detail"]
    assert owner.post(f"/v1/jobs/{first.json()['id']}/cancel").status_code == 202


def test_jobs_are_listed_newest_first_across_pages_and_by_state(
    owner: httpx.Client, uploaded: dict[str, str]
) -> None:
    created = []
    for index in range(5):
        job = owner.post(
            "/v1/jobs", json={**uploaded, "config": {"epochs": 1}, "name": f"page-{index}"}
        ).json()
        owner.post(f"/v1/jobs/{job['id']}/cancel")
        created.append(job["id"])
    for job_id in created:  # a job the worker had already claimed passes through 'cancelling'
        _wait_for_state(owner, job_id, "cancelled")
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2, "state": "cancelled"} | ({"cursor": cursor} if cursor else {})
        page = owner.get("/v1/jobs", params=params).json()
        seen += [job["id"] for job in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [job_id for job_id in seen if job_id in created] == list(reversed(created))
    assert owner.get("/v1/jobs", params={"state": "exploded"}).status_code == 422
    unknown = owner.get("/v1/jobs", params={"cursor": "no-such-job"})
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"] == ["query", "cursor"]


def test_cancelling_a_queued_job_is_immediate(
    owner: httpx.Client, uploaded: dict[str, str]
) -> None:
    job = owner.post("/v1/jobs", json={**uploaded, "config": {"epochs": 1}}).json()
    cancelled = owner.post(f"/v1/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 202
    assert cancelled.json()["state"] in ("cancelled", "cancelling")


def test_a_model_in_use_by_a_live_job_cannot_be_deleted(
    owner: httpx.Client, digits_files: DigitsFiles
) -> None:
    model = owner.post(
        "/v1/models", files={"file": ("m.py", digits_files.model.read_bytes() + b"\n# del\n")}
    ).json()
    dataset = owner.post(
        "/v1/datasets", files={"file": ("t.npz", digits_files.validation.read_bytes())}
    ).json()
    job = owner.post(
        "/v1/jobs",
        json={"model_id": model["id"], "dataset_id": dataset["id"], "config": {"epochs": 200}},
    ).json()
    response = owner.delete(f"/v1/models/{model['id']}")
    if owner.get(f"/v1/jobs/{job['id']}").json()["state"] not in (
        "succeeded",
        "failed",
        "cancelled",
    ):
        assert response.status_code == 409 and job["id"] in response.json()["detail"]
    owner.post(f"/v1/jobs/{job['id']}/cancel")


def test_openapi_is_served_with_stable_operation_ids_and_request_ids(stack: Stack) -> None:
    spec = httpx.get(f"{stack.base_url}/openapi.json").json()
    operation_ids = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {
        "create_job",
        "get_job",
        "list_jobs",
        "cancel_job",
        "upload_model",
        "upload_dataset",
        "stream_job_events",
        "download_job_checkpoint",
        "list_job_metrics",
        "list_job_records",
    } <= operation_ids
    assert all(path.startswith(("/v1/", "/healthz")) for path in spec["paths"])
    assert httpx.get(f"{stack.base_url}/docs").status_code == 200
    echoed = httpx.get(f"{stack.base_url}/healthz", headers={"x-request-id": "abc123"})
    assert echoed.headers["x-request-id"] == "abc123"
    assert httpx.get(f"{stack.base_url}/healthz").headers["x-request-id"]


# -- searches ---------------------------------------------------------------------------------------
def _search_body(uploaded: dict[str, str], **config: object) -> dict[str, object]:
    space = {"learning_rate": {"type": "loguniform", "low": 1e-4, "high": 1e-2}}
    return {**uploaded, "config": {"search_space": space, "max_trials": 2, **config}}


@pytest.mark.parametrize(
    ("config", "loc_tail", "message"),
    [
        (
            {"search_space": {"learning_rate": {"type": "loguniform", "low": 0, "high": 1}}},
            ["search_space", "learning_rate", "loguniform"],
            "positive bounds",
        ),
        (
            {"search_space": {"batch_size": {"type": "choice", "options": []}}},
            ["search_space", "batch_size", "choice", "options"],
            "at least one option",
        ),
        (
            {"search_space": {"weight_decay": {"type": "uniform", "low": 0.2, "high": 0.1}}},
            ["search_space", "weight_decay", "uniform"],
            "must be smaller",
        ),
        (
            {"search_space": {"hidden": {"type": "randint", "low": 1, "high": 4}}},
            ["search_space"],
            "prefix keyword arguments",
        ),
        ({"algorithm": "grid"}, [], "grid search needs"),
        (
            {"search_space": {"epochs": {"type": "uniform", "low": 1, "high": 5}}},
            ["search_space", "epochs"],
            "takes integers",
        ),
        (
            {"search_space": {"num_stages": {"type": "choice", "options": [2, 4]}}},
            ["search_space", "num_stages"],
            "only used with parallelism",
        ),
        ({"base_config": {"num_nodes": 2}}, ["base_config", "num_nodes"], "different workers"),
        (
            {
                "search_space": {"batch_size": {"type": "choice", "options": [16, 33]}},
                "base_config": {"num_gpus": 2},
            },
            ["search_space", "batch_size"],
            "does not fit base_config",
        ),
    ],
)
def test_a_bad_search_is_422_naming_the_field(
    owner: httpx.Client, uploaded: dict[str, str], config: dict, loc_tail: list[str], message: str
) -> None:
    before = owner.get("/v1/searches").json()["data"]
    response = owner.post("/v1/searches", json=_search_body(uploaded, **config))
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]
    assert any(
        e["loc"][: 2 + len(loc_tail)] == ["body", "config", *loc_tail] and message in e["msg"]
        for e in errors
    ), errors
    assert owner.get("/v1/searches").json()["data"] == before


def test_searches_are_idempotent_owned_and_cancellable(
    owner: httpx.Client, other_owner: httpx.Client, uploaded: dict[str, str]
) -> None:
    body = _search_body(uploaded, base_config={"epochs": 1})
    first = owner.post("/v1/searches", json=body, headers={"Idempotency-Key": "search-1"})
    replay = owner.post("/v1/searches", json=body, headers={"Idempotency-Key": "search-1"})
    assert (first.status_code, replay.status_code) == (201, 200)
    assert first.json()["id"] == replay.json()["id"]
    changed = owner.post(
        "/v1/searches",
        json=_search_body(uploaded, max_trials=3),
        headers={"Idempotency-Key": "search-1"},
    )
    assert changed.status_code == 409
    search_id = first.json()["id"]
    for path in ("", "/trials", "/events"):
        assert other_owner.get(f"/v1/searches/{search_id}{path}").status_code == 404
    assert other_owner.post(f"/v1/searches/{search_id}/cancel").status_code == 404
    cancelled = owner.post(f"/v1/searches/{search_id}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["cancel_requested"] is True
    _wait_for_search(owner, search_id, "cancelled")
    assert (
        owner.get("/v1/searches", params={"state": "cancelled"}).json()["data"][0]["id"]
        == search_id
    )


def _wait_for_search(client: httpx.Client, search_id: str, state: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.get(f"/v1/searches/{search_id}").json()["state"] == state:
            return
        time.sleep(0.3)
    raise AssertionError(f"search {search_id} did not reach {state} in {timeout} s")
