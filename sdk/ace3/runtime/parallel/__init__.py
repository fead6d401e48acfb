"""Parallelism strategies: one object per way of splitting the work (see
:mod:`ace3.runtime.parallel.base` for what each one does for the engine).

- :class:`~ace3.runtime.parallel.ddp.DataParallel`: DDP (ZeRO stage 0);
- :class:`~ace3.runtime.parallel.zero1.ZeroRedundancy`: ZeRO-1;
- :class:`~ace3.runtime.parallel.fsdp.FullyShardedDataParallel`: ZeRO-2/3 and offload;
- :class:`~ace3.runtime.parallel.pipeline.PipelineParallel`: pipeline and layer parallel;
- :class:`~ace3.runtime.parallel.tensor.TensorParallel`: tensor parallel.

:func:`strategy_for` picks the one a config asks for; the layout's degrees are
:class:`~ace3.runtime.parallel.dims.ParallelDims`.
"""

from __future__ import annotations

from ace3.config import TrainingConfig, runs_pipeline, runs_tensor_parallel
from ace3.runtime.parallel.base import Strategy
from ace3.runtime.parallel.ddp import DataParallel
from ace3.runtime.parallel.dims import ParallelDims
from ace3.runtime.parallel.fsdp import FullyShardedDataParallel
from ace3.runtime.parallel.pipeline import PipelineParallel
from ace3.runtime.parallel.sharding import sharding_plan
from ace3.runtime.parallel.tensor import TensorParallel
from ace3.runtime.parallel.zero1 import ZeroRedundancy
from ace3.runtime.process.distributed import DistContext


def strategy_for(config: TrainingConfig, ctx: DistContext) -> Strategy:
    """The strategy of ``config`` on this job's processes."""
    dims = ParallelDims.for_job(config, ctx.world_size, ctx.rank)
    if runs_pipeline(config):
        return PipelineParallel(config, ctx, dims)
    if runs_tensor_parallel(config):
        return TensorParallel(config, ctx, dims)
    plan = sharding_plan(config, ctx.device)
    if plan is None:
        return DataParallel(config, ctx, dims)
    if plan.fsdp:
        return FullyShardedDataParallel(config, ctx, dims, plan=plan)
    return ZeroRedundancy(config, ctx, dims)


__all__ = ["ParallelDims", "Strategy", "strategy_for"]
