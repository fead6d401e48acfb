"""The HTTP core: typed errors with request ids, retries, backoff, idempotency keys."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest

import ace3
from ace3.client._http import MAX_RETRY_AFTER, USER_AGENT, parse_retry_after, retry_delay
from tests.unit.sdk.sdk_fakes import MockAPI, job_json


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, ace3.BadRequestError),
        (401, ace3.AuthenticationError),
        (403, ace3.PermissionDeniedError),
        (404, ace3.NotFoundError),
        (409, ace3.ConflictError),
        (413, ace3.PayloadTooLargeError),
        (422, ace3.ValidationError),
        (429, ace3.RateLimitError),
        (500, ace3.InternalServerError),
        (503, ace3.InternalServerError),
        (418, ace3.APIStatusError),
    ],
)
def test_error_status_maps_to_typed_error_with_request_id(api: MockAPI, status, error_class):
    api.route(
        "GET",
        "/v1/jobs/job_1",
        httpx.Response(status, json={"detail": "nope"}, headers={"x-request-id": "req_abc"}),
    )
    client = api.client(max_retries=0)
    with pytest.raises(error_class) as caught:
        client.jobs.retrieve("job_1")
    error = caught.value
    assert type(error) is error_class
    assert isinstance(error, ace3.APIStatusError) and isinstance(error, ace3.ACE3Error)
    assert error.status_code == status
    assert error.request_id == "req_abc"
    assert error.body == {"detail": "nope"}
    assert error.message == "nope"
    assert "req_abc" in str(error)


def test_request_id_falls_back_to_the_one_sent(api: MockAPI):
    api.route("GET", "/v1/jobs/job_1", httpx.Response(404, text="not json"))
    with pytest.raises(ace3.NotFoundError) as caught:
        api.client().jobs.retrieve("job_1")
    assert caught.value.request_id == api.requests[0].headers["x-request-id"]
    assert caught.value.message == "not json"


def test_validation_error_names_each_field_and_reason(api: MockAPI):
    detail = [
        {
            "loc": ["body", "config", "batch_size"],
            "msg": "must be divisible by 4",
            "type": "value_error",
        },
        {"loc": ["body", "model_id"], "msg": "Field required", "type": "missing"},
    ]
    api.route("POST", "/v1/jobs", httpx.Response(422, json={"detail": detail}))
    with pytest.raises(ace3.ValidationError) as caught:
        api.client().jobs.create(model_id="m", dataset_id="d", idempotency_key="k")
    error = caught.value
    assert error.errors == detail
    assert "config.batch_size: must be divisible by 4" in str(error)
    assert "model_id: Field required" in str(error)
    assert len(api.requests) == 1  # a 422 is not retried


def test_every_request_carries_auth_user_agent_and_request_id(api: MockAPI):
    api.route("GET", "/v1/jobs/job_1", httpx.Response(200, json=job_json()))
    api.client().jobs.retrieve("job_1")
    api.client().jobs.retrieve("job_1")
    first, second = api.requests
    assert first.headers["authorization"] == "Bearer sk-test"
    assert first.headers["user-agent"] == USER_AGENT == f"ace3-python/{ace3.__version__}"
    assert first.headers["x-request-id"] != second.headers["x-request-id"]


def test_retries_503_then_429_then_succeeds(api: MockAPI, sleeps):
    api.route(
        "GET",
        "/v1/jobs/job_1",
        httpx.Response(503, json={"detail": "busy"}),
        httpx.Response(429, json={"detail": "slow down"}),
        httpx.Response(200, json=job_json(state="running")),
    )
    job = api.client(max_retries=2).jobs.retrieve("job_1")
    assert job.state == ace3.JobState.RUNNING
    assert len(api.requests) == 3
    assert len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.5 and 0 <= sleeps[1] <= 1.0  # backoff with full jitter


def test_gives_up_after_max_retries(api: MockAPI, sleeps):
    api.route("GET", "/v1/jobs/job_1", httpx.Response(502, json={"detail": "bad gateway"}))
    with pytest.raises(ace3.InternalServerError):
        api.client(max_retries=3).jobs.retrieve("job_1")
    assert len(api.requests) == 4
    assert len(sleeps) == 3


def test_retry_after_seconds_is_honoured(api: MockAPI, sleeps):
    api.route(
        "GET",
        "/v1/jobs/job_1",
        httpx.Response(429, headers={"retry-after": "3"}),
        httpx.Response(200, json=job_json()),
    )
    api.client().jobs.retrieve("job_1")
    assert sleeps == [3.0]


def test_retry_after_http_date_is_honoured_and_long_waits_capped():
    in_ten = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert 8 <= parse_retry_after({"retry-after": in_ten}) <= 10
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert retry_delay(0, {"retry-after": "3600"}) == MAX_RETRY_AFTER
    assert retry_delay(0, {"retry-after": "0"}) == 0


@pytest.mark.parametrize("status", [400, 401, 404, 409, 413, 422])
def test_client_errors_are_not_retried(api: MockAPI, sleeps, status):
    api.route("GET", "/v1/jobs/job_1", httpx.Response(status, json={"detail": "no"}))
    with pytest.raises(ace3.APIStatusError):
        api.client().jobs.retrieve("job_1")
    assert len(api.requests) == 1
    assert sleeps == []


def test_job_create_retries_with_the_same_idempotency_key(api: MockAPI):
    api.route(
        "POST",
        "/v1/jobs",
        httpx.Response(500, json={"detail": "boom"}),
        httpx.ConnectError("reset"),
        httpx.Response(201, json=job_json()),
    )
    job = api.client().jobs.create(model_id="mdl_1", dataset_id="ds_1", idempotency_key="key-1")
    assert job.id == "job_1"
    keys = [request.headers["idempotency-key"] for request in api.requests]
    assert keys == ["key-1", "key-1", "key-1"]
    bodies = {request.content for request in api.requests}
    assert len(bodies) == 1  # the same body every time, or the server would answer 409


def test_post_without_idempotency_key_is_not_retried(api: MockAPI, sleeps):
    api.route("POST", "/v1/jobs", httpx.Response(503, json={"detail": "busy"}))
    with pytest.raises(ace3.InternalServerError):
        api.client().jobs.create(model_id="mdl_1", dataset_id="ds_1")
    assert len(api.requests) == 1
    assert "idempotency-key" not in api.requests[0].headers


def test_connection_error_is_retried_then_raised(api: MockAPI, sleeps):
    api.route("GET", "/v1/jobs/job_1", httpx.ConnectError("connection refused"))
    with pytest.raises(ace3.APIConnectionError) as caught:
        api.client(max_retries=2).jobs.retrieve("job_1")
    assert not isinstance(caught.value, ace3.APITimeoutError)
    assert "http://ace3.test" in str(caught.value)
    assert len(api.requests) == 3 and len(sleeps) == 2


def test_connection_error_then_success(api: MockAPI):
    api.route(
        "GET",
        "/v1/jobs/job_1",
        httpx.ConnectError("connection refused"),
        httpx.Response(200, json=job_json()),
    )
    assert api.client().jobs.retrieve("job_1").id == "job_1"


def test_timeout_raises_api_timeout_error(api: MockAPI):
    api.route("GET", "/v1/jobs/job_1", httpx.ReadTimeout("slow"))
    with pytest.raises(ace3.APITimeoutError):
        api.client(max_retries=1).jobs.retrieve("job_1")
    assert len(api.requests) == 2


def test_cancel_is_retried_without_a_key_because_it_is_idempotent(api: MockAPI):
    api.route(
        "POST",
        "/v1/jobs/job_1/cancel",
        httpx.Response(503),
        httpx.Response(202, json=job_json(state="cancelling", cancel_requested=True)),
    )
    assert api.client().jobs.cancel("job_1").state == "cancelling"
    assert len(api.requests) == 2


def test_errors_pickle():
    import pickle

    error = ace3.NotFoundError(404, "gone", "req_1", {"detail": "gone"})
    clone = pickle.loads(pickle.dumps(error))
    assert (clone.status_code, clone.message, clone.request_id) == (404, "gone", "req_1")
