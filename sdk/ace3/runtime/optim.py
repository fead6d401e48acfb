"""Build the optimizer named by the config (adamw, adam, sgd); the learning rate is constant."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ace3.config import TrainingConfig


def build_optimizer(
    params: Iterable[nn.Parameter], config: TrainingConfig
) -> torch.optim.Optimizer:
    """``weight_decay`` is decoupled for AdamW and an L2 penalty for Adam and SGD."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters (requires_grad=True)")
    lr, wd = config.learning_rate, config.weight_decay
    if config.optimizer == "adamw":
        return torch.optim.AdamW(trainable, lr=lr, weight_decay=wd)
    if config.optimizer == "adam":
        return torch.optim.Adam(trainable, lr=lr, weight_decay=wd)
    if config.optimizer == "sgd":
        return torch.optim.SGD(trainable, lr=lr, momentum=config.momentum, weight_decay=wd)
    raise ValueError(f"unknown optimizer {config.optimizer!r}")


def current_learning_rate(optimizer: torch.optim.Optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])
