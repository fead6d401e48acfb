"""Gradient unscaling for the loss scalers: divide the grads back, detect inf/NaN on any rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["any_rank", "optimizer_grads", "unscale_grads"]


def _collective_device(local: torch.device) -> torch.device:
    """Where the overflow flag must live for the default process group's backend."""
    backend = str(dist.get_backend())
    if ":" in backend:  # a per-device mapping such as "cpu:gloo,cuda:nccl"
        return local if f"{local.type}:" in backend else torch.device("cpu")
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def any_rank(found: bool, device: torch.device) -> bool:
    """True when ``found`` is True on any rank of the default process group (a collective)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return found
    flag = torch.tensor([1.0 if found else 0.0], device=_collective_device(device))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0.0)


def unscale_grads(grads: list[torch.Tensor], inv_scale: float) -> tuple[bool, torch.device]:
    """Multiply ``grads`` in place by ``inv_scale``; True when any of them holds inf/NaN.

    Grads are grouped by device and dtype and handled by torch's fused check-and-unscale
    kernel (one launch per group, the kernel torch's own GradScaler uses). One host sync.
    """
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for grad in grads:
        groups.setdefault((grad.device, grad.dtype), []).append(grad)
    flags: list[torch.Tensor] = []
    for (device, _dtype), tensors in groups.items():
        found = torch.zeros(1, dtype=torch.float32, device=device)
        inv = torch.full((1,), inv_scale, dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(tensors, found, inv)
        flags.append(found)
    if not flags:
        return False, torch.device("cpu")
    first = flags[0].device
    total = torch.stack([flag.to(first) for flag in flags]).sum()
    return bool(total.item() > 0.0), first


def optimizer_grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradient tensors to unscale (sparse gradients are coalesced, their values used)."""
    grads = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is None:
                continue
            if param.grad.is_sparse:
                if param.grad.dtype is torch.float16:
                    param.grad = param.grad.coalesce()  # duplicates could sum past float16's max
                grads.append(param.grad._values())
            else:
                grads.append(param.grad)
    return grads
