"""A small MLP for scikit-learn's 8x8 digits: the model file ACE3 uploads and trains."""

import torch
from torch import nn


def build_model(hidden: int = 128, dropout: float = 0.1) -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def compute_loss(
    model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optional (this is what ACE3 does by default); returning the logits too gives val_accuracy."""
    inputs, targets = batch
    logits = model(inputs)
    return nn.functional.cross_entropy(logits, targets), logits
