"""How gradients travel between data-parallel replicas (``TrainingConfig.communication_data_type``,
``ddp_bucket_cap_mb``).

- ZeRO 0/1 (DDP): ``fp16``/``bf16`` register DDP's ``fp16_compress_hook`` / its bfloat16
  twin :func:`bf16_reduction_hook` (each bucket is cast, divided by the world size, all-reduced and cast
  back); ``ddp_bucket_cap_mb`` is DDP's ``bucket_cap_mb``. The engine's own step-1 reduction
  (:func:`ace3.runtime.parallel.base.average_over`) casts the same way.
- ZeRO 2/3 (FSDP2): ``MixedPrecisionPolicy(reduce_dtype=...)`` on every unit: gradients are
  reduce-scattered in that dtype (parameters and compute are left as they are).
- Pipeline and tensor layouts: their replicas' average (``average_over``) casts the same way.

gloo reduces float16 and bfloat16 (torch 2.13), so both run on CPU workers too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ace3.config import TrainingConfig

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def reduction_dtype(communication_data_type: str | None) -> torch.dtype | None:
    """The dtype gradients are reduced in (``TrainingConfig.communication_data_type``), or
    None for their own."""
    return _DTYPES.get(communication_data_type or "")


def ddp_options(config: TrainingConfig) -> dict[str, Any]:
    """Keyword arguments of ``DistributedDataParallel`` from the config."""
    if config.ddp_bucket_cap_mb is None:
        return {}
    return {"bucket_cap_mb": config.ddp_bucket_cap_mb}


def register_compression(ddp: nn.Module, dtype: torch.dtype | None, group: Any = None) -> None:
    """DDP's compression hook for ``dtype`` (none for None): torch's ``fp16_compress_hook``;
    for bfloat16 :func:`bf16_reduction_hook`, the same arithmetic as torch's
    ``bf16_compress_hook``, which DDP refuses by its name unless NCCL 2.10+ runs it although
    gloo reduces bfloat16 too."""
    if dtype is None:
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = default_hooks.fp16_compress_hook if dtype == torch.float16 else bf16_reduction_hook
    ddp.register_comm_hook(group, hook)


# (no annotations: DDP compares a hook's annotations with the classes, and this module's are
# strings under ``from __future__ import annotations``)
def bf16_reduction_hook(process_group, bucket):
    """Cast the bucket to bfloat16, divide by the group size, all-reduce, cast back in place
    (as DDP's ``fp16_compress_hook`` does in float16)."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(group.size())
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(done: Any) -> torch.Tensor:
        buffer.copy_(done.value()[0])
        return buffer

    return future.then(decompress)


def fsdp_mixed_precision(communication_data_type: str | None) -> dict[str, Any]:
    """``fully_shard`` keyword arguments: ``mp_policy`` with the reduction dtype, if any."""
    dtype = reduction_dtype(communication_data_type)
    if dtype is None:
        return {}
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return {"mp_policy": MixedPrecisionPolicy(reduce_dtype=dtype)}
