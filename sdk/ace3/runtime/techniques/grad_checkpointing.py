"""Gradient checkpointing: recompute activations in the backward pass instead of storing them.

What gets checkpointed, in this order of preference:

1. a model with an ``activation_checkpointing_enable()`` or ``gradient_checkpointing_enable()``
   method (the Hugging Face convention; the first is transformers 5's name): that method is
   called, non-reentrant;
2. an ``nn.Sequential`` (the model itself, else its largest ``nn.Sequential`` submodule by
   parameter count): its forward runs through ``torch.utils.checkpoint.checkpoint_sequential``
   with ``checkpoint_segments`` segments (default: about the square root of its length, the
   classic memory/compute balance). Only the segments' boundary activations are kept; each
   segment is recomputed once during backward. The RNG state is preserved, so dropout masks
   are the same in the recomputation.

Anything else is refused with a message saying how to make the model checkpointable. In
evaluation (``model.eval()`` or no grad) the forward pass is the normal one.
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential


def _parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def largest_sequential(model: nn.Module) -> tuple[str, nn.Sequential] | None:
    if isinstance(model, nn.Sequential):
        return "the model", model
    candidates = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Sequential) and len(module) > 1
    ]
    if not candidates:
        return None
    name, module = max(candidates, key=lambda item: _parameter_count(item[1]))
    return f"submodule {name!r}", module


def default_segments(length: int) -> int:
    return max(1, round(math.sqrt(length)))


def enable_gradient_checkpointing(model: nn.Module, segments: int | None) -> str:
    """Turn checkpointing on for ``model``; return a sentence saying what was done."""
    # transformers 5 names it activation_checkpointing_enable (the old name warns it goes in v6).
    for method, kwargs in (
        ("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
        ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs"),
    ):
        enable = getattr(model, method, None)
        if not callable(enable):
            continue
        # Non-reentrant: the reentrant kind gives no gradients to adapters (LoRA) whose inputs
        # come from frozen layers, and transformers 4.x defaulted to it.
        try:
            enable(**{kwargs: {"use_reentrant": False}})
        except TypeError:  # (a model's own method without that argument)
            enable()
        return f"{type(model).__name__}.{method}() called"
    found = largest_sequential(model)
    if found is None:
        raise ValueError(
            f"gradient_checkpointing=True needs a checkpointable model: {type(model).__name__} "
            "is not an nn.Sequential, holds no nn.Sequential of 2+ layers and has no "
            "gradient_checkpointing_enable() method. Put the repeated layers in an nn.Sequential "
            "or apply torch.utils.checkpoint in your forward and leave this setting off."
        )
    label, sequential = found
    length = len(sequential)
    wanted = segments if segments is not None else default_segments(length)
    count = min(wanted, length)
    plain_forward = sequential.forward

    def forward(self: nn.Sequential, inputs: Any) -> Any:
        if self.training and torch.is_grad_enabled():
            return checkpoint_sequential(self, count, inputs, use_reentrant=False)
        return plain_forward(inputs)

    sequential.forward = types.MethodType(forward, sequential)
    note = (
        f" (checkpoint_segments={wanted} capped at its {length} layers)" if wanted > length else ""
    )
    return f"{label} ({length} layers) runs in {count} checkpointed segment(s){note}"
