"""A language-model fine-tuning job resumed mid-epoch continues exactly: chat records tokenized
in the job, packed, LoRA on a tiny GPT-2 (dropout on), 2 ranks under real torchrun; the run
resumed from its step-3 checkpoint ends with the same weights, bit for bit, as the run that was
never stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.runtime.test_runtime_huggingface import chat_workdir
from tests.integration.runtime.test_runtime_torchrun import assert_ok, events, run_job

pytestmark = pytest.mark.slow
__all__ = ["chat_workdir"]  # (the fixture, shared with the other Hugging Face runs)


def _job(chat_workdir: Path, **extra: Any) -> dict[str, Any]:
    return {
        "job_id": "chat-resume",
        "config": {
            "batch_size": 4,
            "max_steps": 6,
            "save_interval": 3,
            "learning_rate": 0.05,
            "seed": 0,
            "log_interval": 1,
            "packing": True,
            "sequence_length": 24,
            "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"]},
        },
        "model": {
            "path": str(chat_workdir / "gpt2"),
            "kind": "huggingface",
            "factory": "from_pretrained",
        },
        "dataset": {"path": str(chat_workdir / "chat.jsonl")},
        **extra,
    }


def _checkpoints(job_dir: Path) -> dict[int, dict[str, Any]]:
    return {e["step"]: e for e in events(job_dir) if e["type"] == "checkpoint"}


def _weights(path: str) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(path, weights_only=True)["model"]
    return state


def test_a_resumed_lora_chat_job_ends_with_the_weights_of_one_never_stopped(
    chat_workdir: Path, tmp_path: Path
) -> None:
    whole = tmp_path / "whole"
    assert_ok(run_job(_job(chat_workdir), whole, nproc=2))
    saved = _checkpoints(whole)
    assert sorted(saved) == [3, 6]
    [start] = [e for e in events(whole) if e["type"] == "start"]
    assert start["steps_per_epoch"] > 3, "step 3 is inside the first epoch"

    resumed_dir = tmp_path / "resumed"
    middle = saved[3]
    done = run_job(
        _job(chat_workdir, resume_from=middle["path"], resume_sha256=middle["sha256"]),
        resumed_dir,
        nproc=2,
    )
    assert_ok(done)
    assert "resumed from" in done.stdout
    a, b = _weights(saved[6]["path"]), _weights(_checkpoints(resumed_dir)[6]["path"])
    assert a.keys() == b.keys() and any("lora" in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    earlier = _weights(middle["path"])
    assert not all(torch.equal(a[k], earlier[k]) for k in a), "steps 4-6 trained"
