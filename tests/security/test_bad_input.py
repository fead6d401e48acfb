"""Bad input is a 4xx naming the field, never a 5xx: NUL bytes, integers past the column types,
NaN in JSON, Python that exhausts the parser, search steps that overflow; the OpenAPI document
lists the errors each route returns; 405s carry Allow; uploads are refused before their body."""

from __future__ import annotations

import io
import socket
import time
import zipfile
from typing import Any

import httpx
import pytest

from tests.conftest import Stack


def _locs(response: httpx.Response) -> list[list[Any]]:
    return [error["loc"] for error in response.json()["detail"]]


@pytest.mark.parametrize(
    ("path", "params", "loc"),
    [
        ("/v1/jobs/job%00id", {}, ["path", "job_id"]),
        ("/v1/models/m%00", {}, ["path", "model_id"]),
        ("/v1/searches/s%00/trials", {}, ["path", "search_id"]),
        ("/v1/jobs", {"cursor": "c\x00"}, ["query", "cursor"]),
        ("/v1/datasets", {"cursor": "\x00"}, ["query", "cursor"]),
        ("/v1/jobs/{job}/metrics", {"name": "loss\x00"}, ["query", "name"]),
        ("/v1/jobs/{job}/metrics", {"since_step": 2**31}, ["query", "since_step"]),
        ("/v1/jobs/{job}/records", {"after": 2**63}, ["query", "after"]),
        ("/v1/jobs/{job}/events", {"records_after": 2**63}, ["query", "records_after"]),
        ("/v1/jobs/{job}/logs", {"after": 2**63}, ["query", "after"]),
        ("/v1/jobs/{job}/events", {"logs_after": 2**63}, ["query", "logs_after"]),
        ("/v1/jobs/{job}/events", {"metrics_after": 10**30}, ["query", "metrics_after"]),
    ],
)
def test_nul_bytes_and_integers_past_the_columns_are_422_naming_the_parameter(
    client: httpx.Client, running_job: str, path: str, params: dict[str, Any], loc: list[str]
) -> None:
    response = client.get(path.format(job=running_job), params=params)
    assert response.status_code == 422, response.text
    assert loc in _locs(response)


@pytest.mark.parametrize(
    "event_id",
    ["99999999999999999999:0", "\u00b2:1", "1:2:3:4", "1:2:", "0:0:99999999999999999999"],
)
def test_a_malformed_last_event_id_is_422_before_the_stream_starts(
    client: httpx.Client, running_job: str, event_id: str
) -> None:
    response = client.get(
        f"/v1/jobs/{running_job}/events", headers={"Last-Event-ID": event_id.encode("latin-1")}
    )
    assert response.status_code == 422, response.text
    assert ["header", "last-event-id"] in _locs(response)


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (b'{"model_id": "m", "dataset_id": "d", "config": {"learning_rate": NaN}}',
         ["body", "config", "learning_rate"]),
        (b'{"model_id": "m", "dataset_id": "d", "model_kwargs": {"scale": -Infinity}}',
         ["body", "model_kwargs", "scale"]),
        (b'{"model_id": "m", "dataset_id": "d", "name": "a\\u0000b"}', ["body", "name"]),
        (b'{"model_id": "m\\u0000", "dataset_id": "d"}', ["body", "model_id"]),
        (b'{"model_id": "m", "dataset_id": "d", "name": "\\ud800"}', ["body", "name"]),
    ],
)  # fmt: skip
def test_nan_infinity_and_unstorable_text_in_json_are_422_naming_the_field(
    client: httpx.Client, body: bytes, loc: list[str]
) -> None:
    response = client.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert loc in _locs(response)


def test_json_nested_past_the_limit_is_422_naming_where(client: httpx.Client) -> None:
    kwargs: dict[str, Any] = {}
    innermost = kwargs
    for _ in range(500):
        innermost["a"] = {}
        innermost = innermost["a"]
    body = {"model_id": "m", "dataset_id": "d", "model_kwargs": kwargs}
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"][:3] == ["body", "model_kwargs", "a"] and "nested deeper" in error["msg"]


def test_a_body_that_is_not_json_is_422_even_when_not_utf8(client: httpx.Client) -> None:
    response = client.post("/v1/jobs", content=b"\xff\xfe", headers={"content-type": "text/plain"})
    assert response.status_code == 422, response.text
    assert ["body"] in _locs(response)


def test_a_nul_byte_in_an_upload_form_field_is_422(client: httpx.Client) -> None:
    response = client.post(
        "/v1/models", files={"file": ("m.py", b"x = 1\n")}, data={"name": "model\x00"}
    )
    assert response.status_code == 422, response.text
    assert ["body", "name"] in _locs(response)


@pytest.mark.parametrize(
    "source",
    [b"x = " + b"-" * 200_000 + b"1\n", b"x = " + b"1+" * 200_000 + b"1\n"],
    ids=["memory-error", "recursion-error"],
)
def test_python_that_exhausts_the_parser_is_422_naming_the_file(
    client: httpx.Client, source: bytes
) -> None:
    response = client.post("/v1/models", files={"file": ("deep.py", source)})
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"] == ["body", "file"] and "deep.py is not valid Python" in error["msg"]


def test_a_search_step_too_small_for_its_range_is_422_naming_q(client: httpx.Client) -> None:
    space = {"weight_decay": {"type": "quniform", "low": 0, "high": 1, "q": 5e-324}}
    body = {"model_id": "m", "dataset_id": "d", "config": {"search_space": space}}
    response = client.post("/v1/searches", json=body)
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]
    assert any(
        e["loc"][:4] == ["body", "config", "search_space", "weight_decay"] and "q" in e["msg"]
        for e in errors
    ), errors


def test_zips_without_file_type_bits_are_accepted_as_model_archives(client: httpx.Client) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        zipped.writestr("zpkg/__init__.py", "")
        zipped.writestr("zpkg/model.py", "def build_model():\n    pass\n")
    response = client.post(
        "/v1/models",
        files={"file": ("zpkg.zip", buffer.getvalue())},
        data={"entry_module": "zpkg.model"},
    )
    assert response.status_code == 201, response.text


def test_405s_allow_every_method_of_the_path(stack: Stack) -> None:
    cases = {"/v1/jobs": "GET, POST", "/v1/models/abc": "DELETE, GET", "/healthz": "GET"}
    for path, allowed in cases.items():
        response = httpx.put(f"{stack.base_url}{path}")
        assert response.status_code == 405, path
        assert response.headers["allow"] == allowed, path


def test_openapi_lists_the_errors_each_route_returns(stack: Stack) -> None:
    spec = httpx.get(f"{stack.base_url}/openapi.json").json()
    operations = {
        op["operationId"]: (path, op)
        for path, item in spec["paths"].items()
        for op in item.values()
    }
    for operation_id, (path, operation) in operations.items():
        documented = set(operation["responses"])
        if path.startswith("/v1/"):
            assert {"401", "503"} <= documented, operation_id
        if "{" in path:
            assert "404" in documented, operation_id
        if operation.get("parameters") or "requestBody" in operation:
            assert "422" in documented, operation_id
    for operation_id in ("create_job", "create_search", "delete_model", "delete_dataset"):
        assert "409" in operations[operation_id][1]["responses"], operation_id
    for operation_id in ("upload_model", "upload_dataset"):
        assert "413" in operations[operation_id][1]["responses"], operation_id


def test_unauthenticated_uploads_are_refused_before_the_body_is_sent(stack: Stack) -> None:
    """The request announces 2 MB and sends none of it: the 401 must come without waiting."""
    for authorization in ("", "Authorization: Bearer ace3_000000000000_unknown\r\n"):
        with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as connection:
            connection.sendall(
                b"POST /v1/datasets HTTP/1.1\r\nHost: test\r\n"
                + authorization.encode()
                + b"Content-Type: multipart/form-data; boundary=x\r\n"
                + b"Content-Length: 2000000\r\n\r\n"
            )
            started = time.monotonic()
            connection.settimeout(5)
            head = connection.recv(4096)
        assert head.startswith(b"HTTP/1.1 401"), head[:200]
        assert time.monotonic() - started < 5
