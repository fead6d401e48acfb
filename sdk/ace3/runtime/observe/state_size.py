"""The size of the training state: what training must keep in memory (parameters, gradients,
optimizer state), for ``ace3.MemoryProfiler``'s efficiency and the strategies' memory plans.

No torch import at module level (the SDK's profiler imports this module lazily)."""

from __future__ import annotations

from typing import Any


def training_state_bytes(model: Any, optimizer: Any = None) -> int:
    """Bytes held by the training state: the model's parameters, their gradients, the
    optimizer's parameters (O2's float32 master weights) and their gradients, and every tensor
    in the optimizer's state (Adam moments, momentum buffers, step counters).

    Tensors are counted once even when shared (tied weights, an optimizer holding views).
    Optimizer state appears after the first ``optimizer.step()``: call this after training
    (or at least one step) to count it. ``model`` may be wrapped (DDP): anything with
    ``parameters()``.
    """
    import torch

    if not hasattr(model, "parameters"):
        raise TypeError(
            f"model must be a torch.nn.Module (anything with .parameters()), got "
            f"{type(model).__name__}"
        )
    if optimizer is not None and not hasattr(optimizer, "state"):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}"
        )
    seen: set[tuple[str, int, int]] = set()
    total = 0

    def count(tensor: Any) -> None:
        nonlocal total
        if not isinstance(tensor, torch.Tensor) or tensor.is_meta:
            return
        # A sharded (DTensor) parameter or state counts its local shard: what this rank holds.
        tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        nbytes = tensor.numel() * tensor.element_size()
        key = (str(tensor.device), tensor.data_ptr(), nbytes)
        if nbytes == 0 or key in seen:
            return
        seen.add(key)
        total += nbytes

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            count(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    for param in model.parameters():
        count(param)
        if param.grad is not None:
            count(param.grad)
    if optimizer is not None:
        # The optimizer's own parameters too: under O2 they are float32 master copies of the
        # model's 16-bit weights, with their own gradients (counted once when shared).
        for group in optimizer.param_groups:
            for param in group["params"]:
                count(param)
                if param.grad is not None:
                    count(param.grad)
        for state in optimizer.state.values():
            walk(state)
    return total
