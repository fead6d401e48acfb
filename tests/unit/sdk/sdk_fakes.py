"""A fake ACE3 API for the SDK tests: httpx.MockTransport routes and payload builders."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import httpx

import ace3

BASE_URL = "http://ace3.test"
API_KEY = "sk-test"

Handler = Callable[[httpx.Request], httpx.Response]


class MockAPI:
    """Routes requests to handlers and records every request it receives.

    A route's answer is a Response, a callable(request) -> Response, or a list of either
    (served in turn; the last one repeats).
    """

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self._routes: list[tuple[str, re.Pattern[str], list[Any]]] = []

    def route(self, method: str, path: str, *answers: Any) -> MockAPI:
        self._routes.append((method.upper(), re.compile(f"^{path}$"), list(answers)))
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        for method, pattern, answers in self._routes:
            if request.method == method and pattern.match(request.url.path):
                answer = answers.pop(0) if len(answers) > 1 else answers[0]
                if isinstance(answer, BaseException):
                    raise answer
                if callable(answer):
                    return answer(request)
                return _fresh(answer)
        return httpx.Response(404, json={"detail": f"no route {request.method} {request.url.path}"})

    def client(self, **kwargs: Any) -> ace3.Client:
        kwargs.setdefault("api_key", API_KEY)
        kwargs.setdefault("base_url", BASE_URL)
        return ace3.Client(transport=httpx.MockTransport(self), **kwargs)

    def paths(self, method: str | None = None) -> list[str]:
        return [r.url.path for r in self.requests if method is None or r.method == method]


# -- payload builders -----------------------------------------------------------------------


def _fresh(response: httpx.Response) -> httpx.Response:
    """A copy, so one canned response can answer several requests."""
    try:
        content = response.content
    except httpx.ResponseNotRead:
        return response  # a streaming answer: served once
    return httpx.Response(response.status_code, headers=response.headers, content=content)


def job_json(state: str = "queued", **fields: Any) -> dict[str, Any]:
    job = {
        "id": "job_1",
        "name": None,
        "state": state,
        "attempt": 1,
        "model_id": "mdl_1",
        "dataset_id": "ds_1",
        "validation_dataset_id": None,
        "config": ace3.TrainingConfig(epochs=2).model_dump(mode="json"),
        "model_kwargs": {},
        "num_processes": 1,
        "cancel_requested": False,
        "exit_code": None,
        "error": None,
        "final_metrics": None,
        "created_at": "2025-01-01T00:00:00Z",
        "started_at": None,
        "finished_at": None,
    }
    job.update(fields)
    return job


def model_json(**fields: Any) -> dict[str, Any]:
    model = {
        "id": "mdl_1",
        "name": "model",
        "filename": "model.py",
        "kind": "file",
        "entry_module": None,
        "factory": "build_model",
        "sha256": "0" * 64,
        "size_bytes": 10,
        "created_at": "2025-01-01T00:00:00Z",
    }
    model.update(fields)
    return model


def dataset_json(**fields: Any) -> dict[str, Any]:
    dataset = {
        "id": "ds_1",
        "name": "data",
        "filename": "data.npz",
        "kind": "file",
        "format": "npz",
        "sha256": "0" * 64,
        "size_bytes": 10,
        "created_at": "2025-01-01T00:00:00Z",
    }
    dataset.update(fields)
    return dataset


def sse_body(events: Iterable[tuple[str, Any, str | None]]) -> bytes:
    """``(event, data, id)`` triples as an event-stream body."""
    chunks = []
    for event, data, event_id in events:
        block = f"event: {event}\n"
        if event_id is not None:
            block += f"id: {event_id}\n"
        block += f"data: {json.dumps(data)}\n\n"
        chunks.append(block)
    return "".join(chunks).encode()


def sse_response(events: Iterable[tuple[str, Any, str | None]]) -> httpx.Response:
    return httpx.Response(
        200, content=sse_body(events), headers={"content-type": "text/event-stream"}
    )


class DroppingStream(httpx.SyncByteStream):
    """Sends ``chunks`` and then fails like a dropped connection."""

    def __init__(self, chunks: list[bytes]):
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        raise httpx.ReadError("connection dropped")


def metric(step: int, name: str, value: float, epoch: float | None = None, id: int = 0):
    return {"id": id, "step": step, "epoch": epoch, "name": name, "value": value}


def log(seq: int, line: str, rank: int = 0, stream: str = "stdout"):
    return {"seq": seq, "attempt": 1, "rank": rank, "stream": stream, "line": line}


def trial_json(number: int, state: str = "running", **fields: Any) -> dict[str, Any]:
    trial = {
        "id": f"trial_{number}",
        "number": number,
        "state": state,
        "params": {},
        "job_id": f"job_t{number}",
        "value": None,
        "intermediate_values": {},
        "epochs_run": 0,
        "checkpoint_id": None,
        "error": None,
        "created_at": "2025-01-01T00:00:00Z",
        "finished_at": None,
    }
    trial.update(fields)
    return trial


def search_json(state: str = "queued", **fields: Any) -> dict[str, Any]:
    config = ace3.HPConfig(
        search_space={"learning_rate": ace3.hp.loguniform(1e-5, 1e-2)}, max_trials=3
    )
    search = {
        "id": "srch_1",
        "name": None,
        "state": state,
        "model_id": "mdl_1",
        "dataset_id": "ds_1",
        "validation_dataset_id": None,
        "config": config.model_dump(mode="json"),
        "model_kwargs": {},
        "cancel_requested": False,
        "error": None,
        "trial_budget": 3,
        "trials_created": 0,
        "trials_running": 0,
        "trials_succeeded": 0,
        "trials_pruned": 0,
        "trials_failed": 0,
        "epochs_run": 0,
        "best_trial": None,
        "created_at": "2025-01-01T00:00:00Z",
        "updated_at": "2025-01-01T00:00:00Z",
        "finished_at": None,
    }
    search.update(fields)
    return search
