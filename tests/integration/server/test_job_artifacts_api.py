"""Artifacts, checkpoint lookup by hash and resume_from_checkpoint over plain HTTP against the real
API and Postgres: owner isolation, downloads with their checksum, path traversal refused, and
clear 422s naming the field."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobArtifact, JobCheckpoint
from ace3_control.storage import LocalArtifactStore
from tests.conftest import DigitsFiles, Stack


def _http(stack: Stack, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


@pytest.fixture(scope="module")
def owner(stack: Stack) -> Iterator[tuple[httpx.Client, str]]:
    key, owner_id = stack.create_key("artifacts-owner")
    with _http(stack, key) as client:
        yield client, owner_id


@pytest.fixture(scope="module")
def stranger(stack: Stack) -> Iterator[httpx.Client]:
    key, _ = stack.create_key("artifacts-stranger")
    with _http(stack, key) as client:
        yield client


@pytest.fixture(scope="module")
def session(database_url: str) -> Iterator[Session]:
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        yield session
    engine.dispose()


@pytest.fixture(scope="module")
def finished_job(
    stack: Stack, owner: tuple[httpx.Client, str], session: Session, digits_files: DigitsFiles
) -> dict[str, Any]:
    """A finished 2-process job of ``owner`` with two artifacts and a checkpoint, written the
    way the worker writes them (rows in the database, bytes in the store)."""
    client, owner_id = owner
    model = client.post("/v1/models", files={"file": ("model.py", digits_files.model.read_bytes())})
    dataset = client.post(
        "/v1/datasets", files={"file": ("train.npz", digits_files.train.read_bytes())}
    )
    job = Job(
        owner_id=owner_id,
        model_id=model.json()["id"],
        dataset_id=dataset.json()["id"],
        config={"num_gpus": 2},
        model_kwargs={},
        num_processes=2,
        request_hash="h",
        state="succeeded",
        attempt=1,
    )
    session.add(job)
    session.commit()
    store = LocalArtifactStore(stack.root / "storage")
    files = {"tensorboard/events.out": b"tb " * 1000, "profiler/trace é.json": b'{"x": 1}'}
    for path, content in files.items():
        digest = hashlib.sha256(content).hexdigest()
        key = f"job-artifacts/{job.id}/{digest}"
        staged = stack.root / f"staged-{digest}"
        staged.write_bytes(content)
        store.put_file(key, staged)
        session.add(
            JobArtifact(
                job_id=job.id, path=path, attempt=1, version=3, size_bytes=len(content),
                sha256=digest, storage_key=key,
            )
        )  # fmt: skip
    weights = secrets.token_bytes(64)
    checkpoint = JobCheckpoint(
        job_id=job.id, attempt=1, step=46, epoch=2, name="step-00000046.pt",
        sha256=hashlib.sha256(weights).hexdigest(), size_bytes=64, storage_key="checkpoints/x",
        metrics={},
    )  # fmt: skip
    session.add(checkpoint)
    session.commit()
    return {"job": job, "files": files, "checkpoint": checkpoint, **model.json(), **dataset.json()}


def test_artifacts_are_listed_with_their_versions_and_filtered_by_prefix(
    owner: tuple[httpx.Client, str], finished_job: dict[str, Any]
) -> None:
    client, _ = owner
    job_id = finished_job["job"].id
    listed = client.get(f"/v1/jobs/{job_id}/artifacts").json()["data"]
    assert [item["path"] for item in listed] == ["profiler/trace é.json", "tensorboard/events.out"]
    events = listed[1]
    assert events["version"] == 3 and events["size_bytes"] == 3000
    assert events["sha256"] == hashlib.sha256(b"tb " * 1000).hexdigest()
    prefixed = client.get(f"/v1/jobs/{job_id}/artifacts", params={"prefix": "tensorboard"})
    assert [item["path"] for item in prefixed.json()["data"]] == ["tensorboard/events.out"]
    assert client.get(f"/v1/jobs/{job_id}/artifacts", params={"prefix": "tensor"}).json() == {
        "data": []
    }


def test_an_artifact_downloads_with_its_checksum(
    owner: tuple[httpx.Client, str], finished_job: dict[str, Any]
) -> None:
    client, _ = owner
    job_id = finished_job["job"].id
    response = client.get(f"/v1/jobs/{job_id}/artifacts/profiler/trace%20%C3%A9.json")
    assert response.status_code == 200, response.text
    content = finished_job["files"]["profiler/trace é.json"]
    assert response.content == content
    assert response.headers["x-checksum-sha256"] == hashlib.sha256(content).hexdigest()
    assert response.headers["x-artifact-version"] == "3"
    assert "filename*=UTF-8''trace%20%C3%A9.json" in response.headers["content-disposition"]


def test_unknown_paths_are_404_and_traversal_is_400(
    owner: tuple[httpx.Client, str], finished_job: dict[str, Any]
) -> None:
    client, _ = owner
    job_id = finished_job["job"].id
    assert client.get(f"/v1/jobs/{job_id}/artifacts/tensorboard/nope").status_code == 404
    for raw in ("tensorboard/%2E%2E/%2E%2E/secret", "%2Fetc%2Fpasswd", "a//b"):
        response = client.get(f"/v1/jobs/{job_id}/artifacts/{raw}")
        assert response.status_code == 400, (raw, response.text)
        assert "relative to the job's artifacts directory" in response.json()["detail"]


def test_another_owners_artifacts_and_checkpoints_are_invisible(
    stranger: httpx.Client, finished_job: dict[str, Any]
) -> None:
    job_id = finished_job["job"].id
    assert stranger.get(f"/v1/jobs/{job_id}/artifacts").status_code == 404
    assert stranger.get(f"/v1/jobs/{job_id}/artifacts/tensorboard/events.out").status_code == 404
    sha256 = finished_job["checkpoint"].sha256
    assert stranger.get("/v1/checkpoints", params={"sha256": sha256}).json() == {"data": []}


def test_checkpoints_are_found_by_sha256(
    owner: tuple[httpx.Client, str], finished_job: dict[str, Any]
) -> None:
    client, _ = owner
    checkpoint = finished_job["checkpoint"]
    found = client.get("/v1/checkpoints", params={"sha256": checkpoint.sha256.upper()}).json()
    assert [(c["id"], c["job_id"], c["step"]) for c in found["data"]] == [
        (checkpoint.id, finished_job["job"].id, 46)
    ]
    bad = client.get("/v1/checkpoints", params={"sha256": "xyz"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "sha256"]


def test_resume_from_checkpoint_must_be_the_callers_and_match_the_process_count(
    owner: tuple[httpx.Client, str], stranger: httpx.Client, finished_job: dict[str, Any]
) -> None:
    client, _ = owner
    checkpoint_id = finished_job["checkpoint"].id
    ids = {"model_id": finished_job["job"].model_id, "dataset_id": finished_job["job"].dataset_id}

    unknown = client.post("/v1/jobs", json={**ids, "resume_from_checkpoint": "nope"})
    assert unknown.status_code == 422
    (problem,) = unknown.json()["detail"]
    assert problem["loc"] == ["body", "resume_from_checkpoint"] and "nope" in problem["msg"]

    theirs = stranger.post("/v1/jobs", json={**ids, "resume_from_checkpoint": checkpoint_id})
    assert theirs.status_code == 422
    assert ["body", "resume_from_checkpoint"] in [p["loc"] for p in theirs.json()["detail"]]

    one_process = client.post(
        "/v1/jobs", json={**ids, "config": {"num_gpus": 1}, "resume_from_checkpoint": checkpoint_id}
    )
    assert one_process.status_code == 422
    (problem,) = one_process.json()["detail"]
    assert problem["loc"] == ["body", "resume_from_checkpoint"]
    assert "num_gpus * num_nodes = 2" in problem["msg"]


def test_openapi_names_the_new_operations(stack: Stack) -> None:
    paths = httpx.get(f"{stack.base_url}/openapi.json").json()["paths"]
    assert paths["/v1/jobs/{job_id}/artifacts"]["get"]["operationId"] == "list_job_artifacts"
    download = paths["/v1/jobs/{job_id}/artifacts/{path}"]["get"]
    assert download["operationId"] == "download_job_artifact"
    assert paths["/v1/checkpoints"]["get"]["operationId"] == "find_checkpoints"


def _safetensors(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    """A safetensors file written by hand (the server reads the format without torch)."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + b"".join(d for _, _, d in tensors.values())


def _header_only(header: str, data: bytes = bytes(4)) -> bytes:
    raw = header.encode()
    return len(raw).to_bytes(8, "little") + raw + data


def test_uploaded_weights_are_checked_stored_once_and_private(
    owner: tuple[httpx.Client, str], stranger: httpx.Client
) -> None:
    client, _ = owner
    good = _safetensors({"0.weight": ("F32", [2, 2], bytes(16)), "0.bias": ("F32", [2], bytes(8))})
    first = client.post("/v1/checkpoints", files={"file": ("w.safetensors", good)})
    assert first.status_code == 201, first.text
    uploaded = first.json()
    assert uploaded["tensors"] == 2 and uploaded["sha256"] == hashlib.sha256(good).hexdigest()
    again = client.post("/v1/checkpoints", files={"file": ("w.safetensors", good)})
    assert again.status_code == 200 and again.json()["id"] == uploaded["id"]

    content = client.get(f"/v1/checkpoints/{uploaded['id']}/content")
    assert content.status_code == 200 and content.content == good
    assert content.headers["x-checksum-sha256"] == uploaded["sha256"]
    assert stranger.get(f"/v1/checkpoints/{uploaded['id']}/content").status_code == 404

    bad_files = {
        "w.pt": (good, "as a .safetensors file"),
        "short.safetensors": (good[:-4], "data_offsets must be [begin, end] within the data"),
        "long.safetensors": (good + bytes(4), "the tensors take 24 bytes but the file holds 28"),
        "size.safetensors": (
            _safetensors({"x": ("F32", [1], bytes(8))}),
            "8 bytes for its shape of F32 (expected 4)",
        ),
        "json.safetensors": (b"\x05\x00\x00\x00\x00\x00\x00\x00[1,2]", "header is not an object"),
        "dtype.safetensors": (_safetensors({"x": ("OBJ", [1], bytes(4))}), "unknown dtype"),
        "dims.safetensors": (
            _safetensors({"x": ("F32", [1] * 65, bytes(4))}),
            "at most 64 sizes",
        ),
        "digits.safetensors": (
            _header_only(
                '{"x": {"dtype": "F32", "shape": [' + "9" * 5000 + '], "data_offsets": [0, 4]}}'
            ),
            "its header is not JSON",
        ),
        "offsets.safetensors": (
            _header_only('{"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 99999]}}'),
            "within the data",
        ),
        "deep.safetensors": (
            (200_000).to_bytes(8, "little") + b"[" * 100_000 + b"]" * 100_000,
            "its header is not JSON",
        ),
    }
    for name, (data, reason) in bad_files.items():
        response = client.post("/v1/checkpoints", files={"file": (name, data)})
        assert response.status_code == 422, (name, response.text)
        (problem,) = response.json()["detail"]
        assert problem["loc"] == ["body", "file"] and reason in problem["msg"], (name, problem)


def test_init_from_checkpoint_id_must_be_the_callers(
    owner: tuple[httpx.Client, str], stranger: httpx.Client, finished_job: dict[str, Any]
) -> None:
    client, _ = owner
    checkpoint_id = finished_job["checkpoint"].id
    ids = {"model_id": finished_job["job"].model_id, "dataset_id": finished_job["job"].dataset_id}
    loc = ["body", "config", "init_from_checkpoint_id"]

    unknown = client.post("/v1/jobs", json={**ids, "config": {"init_from_checkpoint_id": "a" * 32}})
    assert unknown.status_code == 422
    assert [p["loc"] for p in unknown.json()["detail"]] == [loc]

    theirs = stranger.post(
        "/v1/jobs", json={**ids, "config": {"init_from_checkpoint_id": checkpoint_id}}
    )
    assert theirs.status_code == 422
    assert loc in [p["loc"] for p in theirs.json()["detail"]]

    both = client.post(
        "/v1/jobs",
        json={
            **ids,
            "config": {"num_gpus": 2, "init_from_checkpoint_id": checkpoint_id},
            "resume_from_checkpoint": checkpoint_id,
        },
    )
    assert both.status_code == 422
    assert [p["loc"] for p in both.json()["detail"]] == [loc]
    assert "set one of them" in both.json()["detail"][0]["msg"]

    local = client.post("/v1/jobs", json={**ids, "config": {"init_from": "/etc/passwd"}})
    assert local.status_code == 422
    (problem,) = local.json()["detail"]
    assert problem["loc"] == ["body", "config", "init_from"]
    assert "POST /v1/checkpoints" in problem["msg"]

    for path in ("/etc/hostname", "/etc/no-such-file"):  # the same answer: no file probes
        teacher = {"teacher_model_id": ids["model_id"], "teacher_checkpoint": path}
        local_teacher = client.post("/v1/jobs", json={**ids, "config": {"distillation": teacher}})
        assert local_teacher.status_code == 422, local_teacher.text
        (problem,) = local_teacher.json()["detail"]
        assert problem["loc"] == ["body", "config", "distillation", "teacher_checkpoint"]
        assert "POST /v1/checkpoints" in problem["msg"]

    searched = client.post(
        "/v1/searches",
        json={
            **ids,
            "config": {"search_space": {"init_from_checkpoint_id": {"type": "choice",
                                                                  "options": ["c" * 32]}}},
        },
    )  # fmt: skip
    assert searched.status_code == 422, searched.text
    assert "cannot be searched" in searched.text

    search = client.post(
        "/v1/searches",
        json={
            **ids,
            "config": {
                "search_space": {
                    "learning_rate": {"type": "loguniform", "low": 1e-4, "high": 1e-2}
                },
                "base_config": {"init_from_checkpoint_id": "b" * 32},
            },
        },
    )
    assert search.status_code == 422, search.text
    assert ["body", "config", "base_config", "init_from_checkpoint_id"] in [
        p["loc"] for p in search.json()["detail"]
    ]
