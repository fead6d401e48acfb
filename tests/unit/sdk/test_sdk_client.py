"""The client: settings from the environment, the default client, uploads skipped when the
server already has the bytes, checkpoint downloads verified."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

import ace3
from ace3.client._packing import pack_directory_bytes
from ace3.files import sha256_file
from tests.unit.sdk.sdk_fakes import MockAPI, dataset_json, model_json


def test_missing_api_key_says_to_set_ace3_api_key():
    with pytest.raises(ace3.ACE3Error, match="ACE3_API_KEY") as caught:
        ace3.Client()
    assert not isinstance(caught.value, ace3.APIStatusError)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ACE3_API_KEY", "sk-env")
    assert ace3.Client().base_url == "http://127.0.0.1:8000"
    monkeypatch.setenv("ACE3_BASE_URL", "http://example.test:9000/")
    client = ace3.Client()
    assert client.base_url == "http://example.test:9000"
    assert client.api_key == "sk-env"


def test_default_client_is_the_latest_constructed(monkeypatch: pytest.MonkeyPatch):
    first = ace3.Client(api_key="a")
    second = ace3.Client(api_key="b")
    assert ace3.get_default_client() is second
    ace3.set_default_client(first)
    assert ace3.get_default_client() is first
    first.close()
    monkeypatch.setenv("ACE3_API_KEY", "sk-env")
    fresh = ace3.get_default_client()  # a closed default is replaced
    assert fresh is not first and fresh.api_key == "sk-env"


def test_context_manager_closes(api: MockAPI):
    with api.client() as client:
        assert not client.is_closed
    assert client.is_closed


def known(items: list[dict]):
    return lambda request: httpx.Response(200, json={"data": items, "next_cursor": None})


def test_load_model_skips_the_upload_when_the_hash_is_known(api: MockAPI, tmp_path: Path):
    path = tmp_path / "model.py"
    path.write_text("def build_model():\n    pass\n")
    digest = sha256_file(path)
    api.route("GET", "/v1/models", known([model_json(id="mdl_9", sha256=digest)]))
    ref = api.client().load_model(path)
    assert ref.id == "mdl_9" and not ref.uploaded
    assert api.paths() == ["/v1/models"]
    assert api.requests[0].url.params["sha256"] == digest


def test_load_model_uploads_an_unknown_file(api: MockAPI, tmp_path: Path):
    path = tmp_path / "model.py"
    path.write_text("def make():\n    pass\n")
    api.route("GET", "/v1/models", known([]))
    api.route(
        "POST", "/v1/models", httpx.Response(201, json=model_json(id="mdl_2", factory="make"))
    )
    client = api.client()
    ref = client.load_model(str(path), factory="make", name="mine")
    assert ref.id == "mdl_2" and ref.uploaded and ref.client is client
    upload = api.requests[1]
    body = upload.content
    assert b'name="file"; filename="model.py"' in body
    assert b"def make()" in body
    assert b'name="factory"\r\n\r\nmake' in body
    assert b'name="name"\r\n\r\nmine' in body
    assert b'name="entry_module"' not in body
    assert upload.headers["idempotency-key"]


def test_an_upload_is_retried_with_the_same_key_and_the_whole_file(api: MockAPI, tmp_path: Path):
    path = tmp_path / "data.csv"
    path.write_text("a,target\n1,0\n" * 1000)
    api.route("GET", "/v1/datasets", known([]))
    api.route(
        "POST",
        "/v1/datasets",
        httpx.Response(503),
        httpx.ReadTimeout("slow"),
        httpx.Response(201, json=dataset_json()),
    )
    api.client().load_dataset(path)
    uploads = [request for request in api.requests if request.method == "POST"]
    assert len(uploads) == 3
    assert len({request.headers["idempotency-key"] for request in uploads}) == 1
    assert all(path.read_bytes() in request.content for request in uploads)


def test_load_model_uploads_again_when_the_known_copy_has_another_factory(api: MockAPI, tmp_path):
    path = tmp_path / "model.py"
    path.write_text("class Net: pass\n")
    api.route("GET", "/v1/models", known([model_json(sha256=sha256_file(path))]))
    api.route("POST", "/v1/models", httpx.Response(201, json=model_json(id="mdl_3", factory="Net")))
    assert api.client().load_model(path, factory="Net").id == "mdl_3"


def test_load_model_directory_is_packed_under_its_package_name(api: MockAPI, tmp_path: Path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("def build_model():\n    pass\n")
    expected = hashlib.sha256(pack_directory_bytes(package, prefix="mypkg")).hexdigest()
    api.route("GET", "/v1/models", known([]))
    api.route(
        "POST",
        "/v1/models",
        httpx.Response(201, json=model_json(kind="archive", entry_module="mypkg.model")),
    )
    api.client().load_model(package, entry_module="mypkg.model")
    assert api.requests[0].url.params["sha256"] == expected
    assert b'filename="mypkg.tar.gz"' in api.requests[1].content
    assert b'name="entry_module"\r\n\r\nmypkg.model' in api.requests[1].content


def test_load_model_directory_needs_a_real_entry_module(api: MockAPI, tmp_path: Path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    with pytest.raises(ValueError, match="entry_module="):
        api.client().load_model(package)
    with pytest.raises(ace3.PackingError, match=r"mypkg/nothere\.py"):
        api.client().load_model(package, entry_module="mypkg.nothere")
    assert api.requests == []


def test_missing_paths_raise_file_not_found_naming_the_path(api: MockAPI, tmp_path: Path):
    client = api.client()
    with pytest.raises(FileNotFoundError, match=r"nope\.py"):
        client.load_model(tmp_path / "nope.py")
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        client.load_dataset(tmp_path / "missing_dir")
    assert api.requests == []


def test_load_dataset_skips_the_upload_when_the_hash_is_known(api: MockAPI, tmp_path: Path):
    path = tmp_path / "digits.npz"
    path.write_bytes(b"npz bytes")
    api.route("GET", "/v1/datasets", known([dataset_json(id="ds_7", sha256=sha256_file(path))]))
    ref = api.client().load_dataset(path)
    assert ref.id == "ds_7" and not ref.uploaded
    assert api.paths("POST") == []


def test_load_dataset_directory_is_packed_and_uploaded(api: MockAPI, tmp_path: Path):
    data_dir = tmp_path / "digits"
    data_dir.mkdir()
    (data_dir / "train.csv").write_text("a,b\n1,2\n")
    api.route("GET", "/v1/datasets", known([]))
    api.route(
        "POST", "/v1/datasets", httpx.Response(201, json=dataset_json(id="ds_8", kind="directory"))
    )
    ref = api.client().load_dataset(data_dir, name="digits")
    assert ref.id == "ds_8" and ref.uploaded
    upload = api.requests[1].content
    assert b'name="kind"\r\n\r\ndirectory' in upload
    assert b'filename="digits.tar.gz"' in upload


def test_records_names_the_kind_of_text_records_in_each_request(api: MockAPI, tmp_path: Path):
    path = tmp_path / "chat.jsonl"
    path.write_text('{"messages": []}\n')
    told = dataset_json(id="ds_1", sha256=sha256_file(path), records="prompt_completion")
    api.route("GET", "/v1/datasets", known([told]))  # (another kind: sent again, to be named)
    api.route("POST", "/v1/datasets", httpx.Response(200, json=told | {"records": "chat"}))
    api.route("POST", "/v1/datasets/register", httpx.Response(201, json=dataset_json(id="ds_2")))
    client = api.client()
    ref = client.load_dataset(path, records="chat")
    assert ref.id == "ds_1" and ref.records == "chat"
    assert b'name="records"\r\n\r\nchat' in api.requests[1].content
    client.datasets.register("s3://b/p/", format="jsonl", records="text")
    assert json.loads(api.requests[2].content)["records"] == "text"
    assert client.load_dataset(path).id == "ds_1" and len(api.paths("POST")) == 2  # (known)


def test_load_dataset_refuses_an_unknown_file_type(api: MockAPI, tmp_path: Path):
    path = tmp_path / "data.parquet"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"\.npz"):
        api.client().load_dataset(path)


def test_download_checkpoint_verifies_sha256(api: MockAPI, tmp_path: Path):
    content = b"checkpoint bytes" * 100
    good = hashlib.sha256(content).hexdigest()
    api.route(
        "GET",
        "/v1/jobs/job_1/checkpoints/ck_1/content",
        httpx.Response(200, content=content, headers={"x-checksum-sha256": good}),
    )
    api.route(
        "GET",
        "/v1/jobs/job_1/checkpoints/ck_2/content",
        httpx.Response(200, content=content, headers={"x-checksum-sha256": "f" * 64}),
    )
    client = api.client()
    checkpoint = ace3.Checkpoint(id="ck_1", name="step-00000100.pt", sha256=good)
    path = client.jobs.download_checkpoint("job_1", checkpoint, tmp_path)
    assert path == tmp_path / "step-00000100.pt" and path.read_bytes() == content
    with pytest.raises(ace3.ChecksumMismatchError):
        client.jobs.download_checkpoint("job_1", "ck_2", tmp_path / "bad.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000100.pt"]


def test_a_download_redirected_to_the_object_store_is_verified_without_the_api_key(
    api: MockAPI, tmp_path: Path
):
    content = b"stored in S3" * 100
    good = hashlib.sha256(content).hexdigest()

    def redirect(target: str, checksum: str) -> httpx.Response:
        location = f"http://store.test/bucket/{target}?X-Amz-Signature=abc"
        return httpx.Response(307, headers={"location": location, "x-checksum-sha256": checksum})

    api.route("GET", "/v1/jobs/job_1/checkpoints/ck_1/content", redirect("ck1", good))
    api.route("GET", "/v1/jobs/job_1/checkpoints/ck_2/content", redirect("ck1", "f" * 64))
    api.route("GET", "/v1/jobs/job_1/checkpoints/ck_3/content", redirect("gone", good))
    api.route("GET", "/bucket/ck1", httpx.Response(200, content=content))
    api.route("GET", "/bucket/gone", httpx.Response(403, text="<Error>AccessDenied</Error>"))
    client = api.client()
    path = client.jobs.download_checkpoint("job_1", "ck_1", tmp_path / "step.pt")
    assert path.read_bytes() == content
    from_store = [r for r in api.requests if r.url.host == "store.test"]
    assert len(from_store) == 1 and "authorization" not in from_store[0].headers
    assert from_store[0].url.params["X-Amz-Signature"] == "abc"
    with pytest.raises(ace3.ChecksumMismatchError):
        client.jobs.download_checkpoint("job_1", "ck_2", tmp_path / "bad.pt")
    with pytest.raises(ace3.PermissionDeniedError, match="AccessDenied"):
        client.jobs.download_checkpoint("job_1", "ck_3", tmp_path / "gone.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step.pt"]


def test_models_list_and_delete(api: MockAPI):
    api.route("GET", "/v1/models/mdl_1", httpx.Response(200, json=model_json()))
    api.route("DELETE", "/v1/models/mdl_1", httpx.Response(204))
    api.route("DELETE", "/v1/datasets/ds_1", httpx.Response(409, json={"detail": "in use"}))
    client = api.client()
    assert client.models.retrieve("mdl_1").factory == "build_model"
    assert client.models.delete("mdl_1") is None
    with pytest.raises(ace3.ConflictError, match="in use"):
        client.datasets.delete("ds_1")


def test_api_objects_tolerate_new_fields():
    job = ace3.Job.model_validate({"id": "j", "state": "paused", "new_field": 1})
    assert job.state == "paused" and not job.is_terminal
    assert ace3.Job.model_validate({"id": "j", "state": "failed"}).is_terminal
    assert json.loads(ace3.Job.model_validate({"id": "j", "state": "queued"}).model_dump_json())
