"""``records=`` names the kind of a ``.jsonl`` dataset's text records (issue 29, point 2),
through the real API on a database of its own: checked against the first records (a 422 naming
``records`` and the line), refused for another format, shown on the dataset, named again on the
same bytes, and accepted on jsonl shards, which a job on a Hugging Face model streams (and
refuses where a file of them would be refused)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import ace3
from tests.integration.server.in_process_api import serve_one_owner

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
BOTH = {"prompt": "a", "completion": "b", "text": "a b"}  # the first record says prompt/completion


def _jsonl(*records: dict[str, Any]) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


@pytest.fixture(scope="module")
def api(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    data_dir = Path(tmp_path_factory.mktemp("records"))
    with (
        serve_one_owner(redis_url, data_dir, "records") as (base, key),
        httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as client,
    ):
        yield client


@pytest.fixture
def client(api: httpx.Client) -> Iterator[ace3.Client]:
    key = api.headers["Authorization"].removeprefix("Bearer ")
    with ace3.Client(api_key=key, base_url=str(api.base_url), max_retries=0) as sdk:
        yield sdk


def _upload(api: httpx.Client, name: str, data: bytes, **form: str) -> httpx.Response:
    return api.post("/v1/datasets", files={"file": (name, data)}, data=form)


def _refused(response: httpx.Response, field: str) -> str:
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", field]
    return str(problem["msg"])


def test_named_records_are_checked_stored_and_shown(api: httpx.Client) -> None:
    chat = _upload(api, "chat.jsonl", _jsonl(CHAT, CHAT), records="chat")
    assert chat.status_code == 201 and chat.json()["records"] == "chat"
    assert api.get(f"/v1/datasets/{chat.json()['id']}").json()["records"] == "chat"
    detected = _upload(api, "text.jsonl", _jsonl({"text": "x"}))
    assert detected.status_code == 201 and detected.json()["records"] == "text"
    msg = _refused(_upload(api, "c.jsonl", _jsonl(CHAT, {"text": "x"}), records="chat"), "records")
    assert "line 2: records='chat'" in msg
    msg = _refused(_upload(api, "p.jsonl", _jsonl(CHAT), records="prompt_completion"), "records")
    assert "line 1" in msg
    buffer = io.BytesIO()
    np.savez(buffer, inputs=np.zeros((2, 2), np.float32), targets=np.zeros(2, np.int64))
    msg = _refused(_upload(api, "d.npz", buffer.getvalue(), records="text"), "records")
    assert "npz file" in msg
    _refused(_upload(api, "x.jsonl", _jsonl(CHAT), records="dialogue"), "records")


def test_the_same_bytes_named_again_take_the_named_kind(
    client: ace3.Client, tmp_path: Path
) -> None:
    path = tmp_path / "both.jsonl"
    path.write_bytes(_jsonl(BOTH, BOTH))
    told = client.load_dataset(path)
    assert told.uploaded and told.records == "prompt_completion"
    named = client.load_dataset(path, records="text")
    assert named.id == told.id and named.records == "text"
    assert client.datasets.retrieve(told.id).records == "text"
    assert client.load_dataset(path).records == "text"  # (no records=: the named kind stays)


def test_jsonl_shards_take_records_and_a_hugging_face_model_streams_them(
    api: httpx.Client, client: ace3.Client, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    from tests.e2e.test_language_models import _gpt2_directory

    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "0.jsonl").write_bytes(_jsonl(CHAT))
    chats = client.load_dataset(shards, format="jsonl", records="chat")
    assert chats.records == "chat"
    (shards / "0.jsonl").write_bytes(_jsonl({"prompt": "a", "completion": "b"}))
    completions = client.load_dataset(shards, format="jsonl", records="prompt_completion")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "0.bin").write_bytes(np.arange(8, dtype=np.uint16).tobytes())
    with pytest.raises(ace3.errors.ValidationError, match="records is for format='jsonl'"):
        client.load_dataset(tmp_path / "t", format="tokens", records="text")
    _gpt2_directory(tmp_path / "gpt2")  # (its tokenizer has no chat template)
    hf_model = client.load_model(tmp_path / "gpt2").id
    model = api.post(
        "/v1/models",
        files={"file": ("m.py", b"import torch\ndef build_model():\n    return torch.nn.Linear(1, 1)\n")},
    )  # fmt: skip
    assert model.status_code == 201, model.text

    def submit(model_id: str, dataset: Any, **config: Any) -> httpx.Response:
        body = {"model_id": model_id, "dataset_id": dataset.id, "config": config}
        return api.post("/v1/jobs", json=body)

    created = submit(hf_model, completions, max_steps=1, packing=True)  # streamed, no longer a 422
    assert created.status_code == 201, created.text
    # what a single .jsonl file of records is refused for, shards of them are too
    assert "epochs" in _refused_at(submit(hf_model, completions, epochs=1), ["config", "epochs"])
    assert "chat template" in _refused_at(submit(hf_model, chats, max_steps=1), ["dataset_id"])
    assert "Hugging Face" in _refused_at(
        submit(model.json()["id"], chats, max_steps=1), ["dataset_id"]
    )


def _refused_at(response: httpx.Response, loc: list[str]) -> str:
    assert response.status_code == 422, response.text
    messages = [p["msg"] for p in response.json()["detail"] if p["loc"] == ["body", *loc]]
    assert messages, response.text
    return " ".join(messages)
