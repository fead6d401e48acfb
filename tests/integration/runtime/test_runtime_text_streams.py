"""Chat records in jsonl shards, streamed into a Hugging Face model's job under real torchrun (2
gloo ranks): each rank tokenizes the records of its own shards with the model's chat template,
packs them, trains and validates on a held-out shard; every checkpoint keeps each rank's data
position with its open pack. The shards lie in place before the run (as the worker leaves them
once fetched); the tiny GPT-2 and its ChatML tokenizer are test_runtime_huggingface's."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.runtime.test_runtime_huggingface import _chat, chat_workdir  # noqa: F401
from tests.integration.runtime.test_runtime_torchrun import assert_ok, events, run_job
from tests.stream_shards import stream_dataset, write_jsonl

pytestmark = pytest.mark.slow


def _text_states(value: Any) -> list[dict[str, Any]]:
    """Every stream reader's ``text`` state inside a loader's saved state."""
    if isinstance(value, dict):
        found = [value["text"]] if isinstance(value.get("text"), dict) else []
        return found + [s for v in value.values() for s in _text_states(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _text_states(v)]
    return []


def test_chat_records_in_shards_are_streamed_tokenized_per_rank_and_packed(
    chat_workdir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    for index in range(5):  # one held out for validation, two for each rank
        write_jsonl(shards / f"{index:06d}.jsonl", [_chat(index * 12 + i) for i in range(12)])
    spec = stream_dataset(shards, "jsonl").model_copy(update={"records": "chat"})
    job = {
        "job_id": "chat-shards",
        "config": {
            "batch_size": 4, "max_steps": 4, "learning_rate": 0.05, "seed": 0, "log_interval": 1,
            "save_interval": 2, "packing": True, "sequence_length": 24, "shuffle_buffer": 4,
        },
        "model": {"path": str(chat_workdir / "gpt2"), "kind": "huggingface",
                  "factory": "from_pretrained"},
        "dataset": spec.model_dump(),
    }  # fmt: skip
    done = run_job(job, tmp_path / "job", nproc=2)
    assert_ok(done)
    logged = done.stdout + done.stderr
    assert "chat records streamed from 4 shard(s)" in logged, logged[-3000:]
    assert "validation: 1 of the dataset's 5 shards held out" in logged
    evs = events(tmp_path / "job")
    [summary] = [e for e in evs if e["type"] == "summary"]
    final = summary["final_metrics"]
    assert math.isfinite(final["train_loss"]) and math.isfinite(final["val_loss"])
    # the readers' counts, all-reduced over both ranks (each read 4 batches of 2 packs)
    assert final["text_examples"] >= 2 * 4 * 2 and final["text_truncated"] >= 0
    assert 0 <= final["text_padding_share"] < 1
    requests = tmp_path / "shard-requests"
    assert {p.name for p in requests.glob("train-*.json")} == {
        "train-r0-w0.json",
        "train-r1-w0.json",
    }
    checkpoint = next(e for e in evs if e["type"] == "checkpoint" and e["step"] == 2)
    state = torch.load(Path(checkpoint["path"]), weights_only=True)
    positions = state["data_per_replica"]
    assert len(positions) == 2
    for position in positions:  # each rank's reader: its counts and its open pack
        [text] = _text_states(position["loader"])
        assert text["counts"]["examples"] > 0
        assert sum(len(ids) for ids, _ in text["pending"]) <= 24
    assert json.dumps(positions[0]["loader"]) != json.dumps(positions[1]["loader"])
