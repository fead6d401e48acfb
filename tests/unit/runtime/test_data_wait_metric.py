"""The training metrics say how long each rank waited for its data: ``data_wait_ms_rank<r>``
and ``data_wait_ms_max``, the mean host time per step in the loop's ``next()`` on its loader
since the last report (what a slow dataset or a stream waiting for shards costs a step)."""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

import ace3
from ace3.runtime.loop.run_metrics import MAX_RANKS_SHOWN, data_wait_values

DELAY = 0.01  # seconds a sample takes to read


class SlowSamples(Dataset[Any]):
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.inputs = torch.linspace(-1.0, 1.0, 64).reshape(16, 4)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay)
        return self.inputs[index], self.inputs[index].sum(dim=0, keepdim=True)


def _history(delay: float) -> dict[str, list[tuple[int, float]]]:
    config = ace3.TrainingConfig(batch_size=4, epochs=1, validation_split=0.0, seed=0,
                                 optimizer="sgd", learning_rate=0.01, log_interval=2)  # fmt: skip
    torch.manual_seed(0)
    return ace3.Trainer(config).train(nn.Linear(4, 1), SlowSamples(delay)).history


def test_a_slow_dataset_s_reading_time_is_the_step_s_data_wait() -> None:
    slow, fast = _history(DELAY), _history(0.0)
    for history in (slow, fast):  # reports at steps 1, 2 and 4 (every 2, and the epoch's end)
        assert [step for step, _ in history["data_wait_ms_rank0"]] == [1, 2, 4]
        assert history["data_wait_ms_max"] == history["data_wait_ms_rank0"]
    # 4 samples a step, 10 ms each: at least 40 ms of every step waits for its batch.
    assert all(wait >= 4 * DELAY * 1000 for _, wait in slow["data_wait_ms_rank0"])
    assert all(wait < 4 * DELAY * 1000 for _, wait in fast["data_wait_ms_rank0"][1:])


def test_per_rank_waits_are_bounded_like_the_other_series() -> None:
    values = data_wait_values([1.0, 5.0, 2.0])
    assert values == {"data_wait_ms_rank0": 1.0, "data_wait_ms_rank1": 5.0,
                      "data_wait_ms_rank2": 2.0, "data_wait_ms_max": 5.0}  # fmt: skip
    assert data_wait_values([3.0] * (MAX_RANKS_SHOWN + 1)) == {"data_wait_ms_max": 3.0}
