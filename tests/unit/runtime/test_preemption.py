"""Preemption in process (one rank): a SIGTERM during a step stops the run after that step
with a checkpoint of it and :class:`ace3.TrainingPreemptedError`; resuming from that checkpoint
ends with exactly the weights of a run that was never interrupted. The SIGTERM handler is the
caller's again after the run. (Two ranks under torchrun: tests/integration/runtime/
test_runtime_preemption.py; a drained worker: tests/e2e/test_preemption.py.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import ace3
from ace3.config.unsupported import unsupported_settings


def _digits() -> TensorDataset:
    data = load_digits()
    inputs = torch.tensor(data.data[:320] / 16.0, dtype=torch.float32)
    return TensorDataset(inputs, torch.tensor(data.target[:320], dtype=torch.int64))


def _mlp(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10))


class SigtermAtStep(ace3.callbacks.Callback):
    """Sends this process a SIGTERM at the end of optimizer step ``step``."""

    def __init__(self, step: int) -> None:
        self.step, self.seen = step, 0

    def on_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self.seen += 1
        if self.seen == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def _trainer(save_dir: Path, **extra: Any) -> ace3.Trainer:
    config = ace3.TrainingConfig(epochs=2, batch_size=32, seed=4, log_interval=3)
    return ace3.Trainer(config, checkpoint_config=ace3.CheckpointConfig(save_dir=str(save_dir)),
                        **extra)  # fmt: skip


def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    data = _digits()
    whole = _mlp(0)
    _trainer(tmp_path / "whole").train(whole, data)

    interrupted = _mlp(0)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ace3.TrainingPreemptedError) as caught:
        _trainer(tmp_path / "cut", callbacks=[SigtermAtStep(7)]).train(interrupted, data)
    assert signal.getsignal(signal.SIGTERM) is before, "the caller's handler is back"
    assert caught.value.step == 7 and caught.value.checkpoint == "step-00000007.pt"
    saved = tmp_path / "cut" / "step-00000007.pt"
    assert torch.load(saved, weights_only=True)["step"] == 7

    resumed = _mlp(99)  # other weights: all of them must come back from the checkpoint
    trainer = _trainer(tmp_path / "resumed")
    trainer.load_checkpoint(saved)
    result = trainer.train(resumed, data, resume=True)
    assert min(step for step, _ in result.history["train_loss"]) > 7
    for (name, a), (_, b) in zip(
        whole.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_with_checkpoint_on_sigterm_off_the_run_keeps_the_callers_handler() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        config = ace3.TrainingConfig(epochs=1, batch_size=64, checkpoint_on_sigterm=False)
        ace3.Trainer(config, callbacks=[SigtermAtStep(2)]).train(_mlp(0), _digits())
        assert seen == [signal.SIGTERM], "the SIGTERM went to the caller's handler"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_grace_setting_is_refused_where_it_cannot_apply() -> None:
    off = ace3.TrainingConfig(checkpoint_on_sigterm=False, preemption_grace_seconds=30)
    assert [p.field for p in unsupported_settings(off)] == ["preemption_grace_seconds"]
    gang = ace3.TrainingConfig(num_nodes=2, preemption_grace_seconds=30)
    assert "num_nodes > 1" in unsupported_settings(gang)[0].reason
    assert unsupported_settings(ace3.TrainingConfig(preemption_grace_seconds=30)) == []
    with pytest.raises(ValueError, match="preemption_grace_seconds"):
        ace3.TrainingConfig(preemption_grace_seconds=0)
