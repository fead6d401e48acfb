"""How much memory an optimizer's state holds (:func:`optimizer_state_bytes`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["optimizer_state_bytes"]


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held by every tensor in ``optimizer.state`` (each tensor counted once)."""
    seen: set[int] = set()
    total = 0
    for value in _tensors(optimizer.state.values()):
        if id(value) not in seen:
            seen.add(id(value))
            total += value.numel() * value.element_size()
    return total


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple) or type(value).__name__ == "dict_values":
        for item in value:
            yield from _tensors(item)
