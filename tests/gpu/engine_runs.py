"""What the GPU checks of the engine share: small data and models made here (no download), a run
of the real engine in this process on the GPU (:func:`ace3.runtime.in_process.train_in_process`:
the same loop, precision levels, optimizer builders, speed settings and checkpoint saver as a
worker's job), and a hook that records what the engine set up while it trains."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import ace3
from ace3.runtime.in_process import InProcessRun, train_in_process
from ace3.runtime.loop.hooks import RunContext, TrainingHook

FEATURES, CLASSES = 64, 10


def classification_data(samples: int = 512, seed: int = 0) -> TensorDataset:
    """``samples`` points of ``FEATURES`` float32 features whose class is the index of the
    largest of the first ``CLASSES`` features (learnable in a few steps), on the CPU: the
    engine's loader pins them and moves each batch to the GPU."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(inputs, inputs[:, :CLASSES].argmax(dim=1))


def sequence_data(samples: int = 256, length: int = 16, width: int = 32) -> TensorDataset:
    """Sequences of ``length`` tokens of ``width`` features, classed by the sign of their mean."""
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(samples, length, width, generator=generator)
    return TensorDataset(inputs, (inputs.mean(dim=(1, 2)) > 0).long())


def mlp(hidden: int = 128, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, CLASSES),
    )  # fmt: skip


def train(
    model: nn.Module,
    data: Any,
    *,
    hooks: Sequence[TrainingHook] = (),
    checkpoint_dir: Path | None = None,
    **fields: Any,
) -> InProcessRun:
    """One run of the engine on this process's GPU (torch picks ``cuda`` when it sees one): one
    epoch of batches of 32, metrics every step, no validation unless ``fields`` ask for it."""
    config = ace3.TrainingConfig(
        **{
            "epochs": 1,
            "batch_size": 32,
            "learning_rate": 1e-2,
            "log_interval": 1,
            "seed": 3,
            "validation_split": 0.0,
            **fields,
        }
    )
    return train_in_process(config, model, data, hooks=hooks, checkpoint_dir=checkpoint_dir)


def losses(run: InProcessRun) -> list[float]:
    return [value for _, value in run.history["train_loss"]]


def learned(run: InProcessRun) -> bool:
    """The mean loss of the last quarter of the steps is below that of the first quarter."""
    values = losses(run)
    quarter = max(1, len(values) // 4)
    return sum(values[-quarter:]) / quarter < sum(values[:quarter]) / quarter


class Recorder(TrainingHook):
    """Calls ``probe(run)`` once when training begins (inside the engine's speed settings, with
    the model placed and the optimizer built) and keeps what it returned in ``seen``."""

    def __init__(self, probe: Callable[[RunContext], Any]) -> None:
        self.probe = probe
        self.seen: Any = None

    def on_train_begin(self) -> None:
        self.seen = self.probe(self.run)


def finite_weights(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(value).all()) for value in model.state_dict().values())
