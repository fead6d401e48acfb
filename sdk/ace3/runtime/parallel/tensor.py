"""Tensor parallelism: linear layers sharded over the tensor-parallel ranks
(:mod:`ace3.runtime.parallel.tensor_plan`); every rank of a replica runs the same batches,
and the sharded layers' collectives run inside the forward and backward passes. Data
parallelism over the tensor-parallel groups: :mod:`ace3.runtime.parallel.split_model`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from ace3.runtime.loop.evaluation import evaluate
from ace3.runtime.loop.precision import Precision
from ace3.runtime.observe.log import ENGINE
from ace3.runtime.parallel.split_model import SplitModel
from ace3.runtime.parallel.tensor_plan import parallelize
from ace3.runtime.user_code import UserCode

if TYPE_CHECKING:
    from ace3.runtime.parallel.parts import StepParts


class TensorParallel(SplitModel):
    """Linear layers sharded over the tensor-parallel ranks of every replica."""

    def prepare(
        self,
        model: nn.Module,
        precision: Precision,
        user: UserCode,
        ckpt: dict[str, Any] | None,
        live_module: bool,
    ) -> nn.Module:
        self.start_split(model, precision, ckpt)
        ctx = self.ctx
        model.to(ctx.device)
        mesh = self.dims.submesh(ctx.device.type, "tp")
        describe = parallelize(model, mesh, user.module)
        precision.prepare_model(model)
        if ctx.is_main:
            ENGINE.info(describe)
        self.shard_replicas(model)
        return model

    def evaluate(self, parts: StepParts, loader: Any) -> dict[str, float]:
        # Every rank of a replica evaluates the same batches: the sums over all ranks are
        # tensor_parallel_size times those of the replicas, so the means are unchanged. Sharded
        # replicas' forward passes are collectives: they run in lockstep.
        self._sync_buffers(parts)
        try:
            return evaluate(
                parts.model, loader, self.ctx.device, parts.precision, parts.user,
                lockstep=self.plan is not None,
            )  # fmt: skip
        finally:
            self.after_evaluation(parts)
