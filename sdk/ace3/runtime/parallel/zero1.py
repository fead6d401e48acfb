"""ZeRO-1: the model replicated under DDP as at stage 0 (:mod:`ace3.runtime.parallel.ddp`), the
optimizer a ``ZeroRedundancyOptimizer``: each rank keeps (and updates) the state of its share
of the parameters and broadcasts them after the step. Checkpoints are sharded
(:mod:`ace3.runtime.checkpoint.sharded`), so they resume on any number of ranks and at any
ZeRO stage.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ace3.runtime.checkpoint.archive import sharded_checkpoint_name, shared_temp_dir
from ace3.runtime.checkpoint.files import SavedCheckpoint, save_atomic
from ace3.runtime.checkpoint.plain import gather_rng
from ace3.runtime.checkpoint.sharded import (
    load_full_model_and_optimizer,
    save_sharded_checkpoint,
)
from ace3.runtime.loop.precision import Precision
from ace3.runtime.parallel.ddp import DataParallel
from ace3.runtime.parallel.sharding import (
    STAGE_SUMMARY,
    full_model_state_dict,
    local_state_bytes,
    zero_redundancy_optimizer,
)
from ace3.runtime.process.distributed import barrier

if TYPE_CHECKING:
    from ace3.runtime.checkpoint.background import BackgroundWriter
    from ace3.runtime.components import Components


class ZeroRedundancy(DataParallel):
    """ZeRO stage 1: the model replicated under DDP, each rank keeps (and updates) the optimizer
    state of its share of the parameters and broadcasts them after the step. Checkpoints are
    sharded (:mod:`ace3.runtime.checkpoint.sharded`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zero_stage = 1

    def describe(self) -> list[str]:
        return [f"ZeRO stage 1 over {self.ctx.world_size} rank(s): {STAGE_SUMMARY[1]}"]

    def make_optimizer(self, model: nn.Module, precision: Precision) -> torch.optim.Optimizer:
        template = super().make_optimizer(model, precision)
        return zero_redundancy_optimizer(precision.optimizer_parameters(model), template)

    def _load_plain(self, ckpt: dict[str, Any], parts: Components) -> None:
        load_full_model_and_optimizer(ckpt, parts, self.ctx)

    def checkpoint_name(self, step: int) -> str:
        return sharded_checkpoint_name(step)

    def save_checkpoint(
        self,
        parts: Components,
        path: Path,
        rng_per_rank: list[Any] | None,
        background: BackgroundWriter | None = None,
    ) -> SavedCheckpoint | None:
        return save_sharded_checkpoint(
            parts, self.ctx, path, self.config, rng_per_rank, background=background
        )

    def save_model_file(self, parts: Components, path: Path, weights_only: bool) -> None:
        """A full checkpoint is written sharded (a ``.dcp.tar`` archive, whatever ``path`` is
        called), staged outside the artifacts directory, which the worker uploads; the weights
        alone are gathered."""
        ctx = self.ctx
        if weights_only:
            state = full_model_state_dict(parts.model, self.shards_parameters, everywhere=False)
            if ctx.is_main:
                save_atomic(state, path)
        else:
            staging = shared_temp_dir(ctx)
            rngs = gather_rng(ctx)
            save_sharded_checkpoint(parts, ctx, path, self.config, rngs, staging)
            barrier(ctx)
            if ctx.local_rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
        barrier(ctx)

    @property
    def shards_parameters(self) -> bool:
        return False

    def state_bytes(self, parts: Components) -> int:
        return local_state_bytes(parts.model, parts.optimizer)
