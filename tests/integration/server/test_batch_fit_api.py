"""A dataset's batches are checked against the model's forward at submission (issue 30, point
3), through the real API on a database of its own (no worker reads its queue): a job or search
whose model cannot take the batches is a 422 naming the dataset field, with nothing stored;
where either side is unknown (compute_loss, a dataset.py) or they fit, the job is created. (And
``eval_prompts`` on a model that is not a Hugging Face directory is a 422 naming it, issue 29.)"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import ace3
from tests.integration.server.in_process_api import serve_one_owner
from tests.shard_sources import tokens_bytes

HEADER = "import torch\nfrom torch import nn\n\n"
LOSS = "return {'loss': torch.zeros((), requires_grad=True)}"


def _model(parameters: str, extra: str = "") -> bytes:
    return (
        f"{HEADER}class Net(nn.Module):\n    def forward(self, {parameters}):\n        {LOSS}\n\n"
        f"def build_model():\n    return Net()\n{extra}"
    ).encode()


def _npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, inputs=np.zeros((8, 4), np.float32), targets=np.zeros(8, np.int64))
    return buffer.getvalue()


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    data_dir = Path(tmp_path_factory.mktemp("batch-fit"))
    with (
        serve_one_owner(redis_url, data_dir, "batch-fit") as (base, key),
        httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as client,
    ):
        yield client


def _stored(api: httpx.Client, path: str, **upload: Any) -> str:
    response = api.post(path, **upload)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.fixture(scope="module")
def ids(api: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    models = {
        "takes_x": _model("x"),
        "two_inputs": _model("input_ids, attention_mask"),
        "causal_lm": _model("input_ids, labels=None, attention_mask=None"),
        "own_loss": _model(
            "input_ids, attention_mask",
            "def compute_loss(model, batch):\n    return model(batch[0], batch[0]).get('loss')\n",
        ),
    }
    found = {
        name: _stored(api, "/v1/models", files={"file": (f"{name}.py", source)})
        for name, source in models.items()
    }
    found["pairs"] = _stored(api, "/v1/datasets", files={"file": ("train.npz", _npz())})
    found["pairs_dir"] = _stored(
        api,
        "/v1/datasets",
        files={"file": ("d.tar.gz", _tar({"train.npz": _npz()}))},
        data={"kind": "directory"},
    )
    found["own_code"] = _stored(
        api,
        "/v1/datasets",
        files={
            "file": ("code.tar.gz", _tar({"dataset.py": b"def build_dataset(split):\n    ...\n"}))
        },
        data={"kind": "directory"},
    )
    shards = tmp_path_factory.mktemp("tokens")
    (shards / "0.bin").write_bytes(tokens_bytes(64))
    base = str(api.base_url).rstrip("/")
    key = api.headers["Authorization"].removeprefix("Bearer ")
    with ace3.Client(api_key=key, base_url=base, max_retries=0) as client:
        found["tokens"] = client.load_dataset(shards, format="tokens").id
    return found


def _job(ids: dict[str, str], model: str, dataset: str, **more: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model_id": ids[model], "dataset_id": ids[dataset]}
    body["config"] = {"max_steps": 1, "sequence_length": 8, **more.pop("config", {})}
    return body | {key: ids[value] for key, value in more.items()}


def _listed(api: httpx.Client, path: str) -> list[str]:
    return [row["id"] for row in api.get(path, params={"limit": 200}).json()["data"]]


@pytest.mark.parametrize(
    ("model", "dataset", "field", "reason"),
    [
        (
            "two_inputs", "pairs", "dataset_id",
            "the dataset gives (inputs, targets) batches, which the engine passes as "
            "model(inputs), but Net.forward(self, input_ids, attention_mask) also requires "
            "'attention_mask'; define compute_loss(model, batch) in two_inputs.py",
        ),
        (
            "two_inputs", "pairs_dir", "dataset_id",
            "also requires 'attention_mask'",
        ),
        (
            "takes_x", "tokens", "dataset_id",
            "the dataset gives dict batches of 'input_ids', 'labels', which the engine passes as "
            "model(**batch), but Net.forward(self, x) has no parameters 'input_ids', 'labels' and "
            "requires 'x', which the batches lack",
        ),
    ],
)  # fmt: skip
def test_a_job_whose_model_cannot_take_the_batches_is_422_and_not_stored(
    api: httpx.Client, ids: dict[str, str], model: str, dataset: str, field: str, reason: str
) -> None:
    before = _listed(api, "/v1/jobs")
    response = api.post("/v1/jobs", json=_job(ids, model, dataset))
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", field]
    assert reason in problem["msg"], problem["msg"]
    assert f"does not fit model '{model}" in problem["msg"], problem["msg"]
    assert _listed(api, "/v1/jobs") == before


def test_the_validation_dataset_and_a_searchs_base_config_are_checked_too(
    api: httpx.Client, ids: dict[str, str]
) -> None:
    body = _job(ids, "takes_x", "pairs", validation_dataset_id="tokens")
    response = api.post("/v1/jobs", json=body)
    assert response.status_code == 422, response.text
    assert [p["loc"] for p in response.json()["detail"]] == [["body", "validation_dataset_id"]]
    search = {
        "model_id": ids["two_inputs"],
        "dataset_id": ids["pairs"],
        "config": {
            "search_space": {"learning_rate": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
            "max_trials": 2,
            "base_config": {"max_steps": 1},
        },
    }
    before = _listed(api, "/v1/searches")
    response = api.post("/v1/searches", json=search)
    assert response.status_code == 422, response.text
    assert [p["loc"] for p in response.json()["detail"]] == [["body", "dataset_id"]]
    assert _listed(api, "/v1/searches") == before


@pytest.mark.parametrize(
    ("model", "dataset", "config"),
    [
        ("takes_x", "pairs", {}),  # model(inputs)
        ("causal_lm", "tokens", {}),  # model(input_ids=..., labels=...)
        ("own_loss", "pairs", {}),  # compute_loss feeds the model: nothing to check
        ("two_inputs", "own_code", {}),  # a dataset.py decides its batches: unknown
        ("two_inputs", "pairs", {"pipeline_parallel_size": 2, "num_gpus": 2}),  # stages
    ],
)
def test_jobs_the_check_cannot_refuse_are_created(
    api: httpx.Client, ids: dict[str, str], model: str, dataset: str, config: dict[str, Any]
) -> None:
    response = api.post("/v1/jobs", json=_job(ids, model, dataset, config=config))
    assert response.status_code == 201, response.text


def test_eval_prompts_on_a_model_that_is_not_a_huggingface_directory_is_422(
    api: httpx.Client, ids: dict[str, str]
) -> None:
    before = _listed(api, "/v1/jobs")
    body = _job(ids, "takes_x", "pairs", config={"eval_prompts": ["Once upon a time"]})
    response = api.post("/v1/jobs", json=body)
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", "config", "eval_prompts"]
    assert "needs a Hugging Face model directory" in problem["msg"]
    assert "model 'takes_x" in problem["msg"] and "of kind 'file'" in problem["msg"]
    assert _listed(api, "/v1/jobs") == before
