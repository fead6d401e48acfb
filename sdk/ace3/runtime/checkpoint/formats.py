"""The formats of jobs that hold whole tensors or shards of them (data parallel, ZeRO):
plain ``step-XXXXXXXX.pt`` (:mod:`ace3.runtime.checkpoint.plain`) and sharded
``step-XXXXXXXX.dcp.tar`` (:mod:`ace3.runtime.checkpoint.sharded`), and :func:`format_for`,
which makes a strategy's format from its name (the gathered format of a split model is
:class:`ace3.runtime.checkpoint.gathered.GatheredFormat`).

Both read either kind on resume: a sharded checkpoint loads on any number of ranks and at any
ZeRO stage (DCP re-shards it into the strategy's state); a plain one needs as many data-parallel
replicas as wrote it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ace3.config import TrainingConfig
from ace3.runtime.checkpoint.archive import sharded_checkpoint_name, shared_temp_dir
from ace3.runtime.checkpoint.files import SavedCheckpoint, checkpoint_name, save_atomic
from ace3.runtime.checkpoint.format import CheckpointFormat, FormatKind, RankStates
from ace3.runtime.checkpoint.gathered import GatheredFormat
from ace3.runtime.checkpoint.plain import (
    gather_rank_states,
    load_plain_state,
    plain_payload,
    restore_schedule,
    resume_position,
)
from ace3.runtime.checkpoint.sharded import (
    ShardedJob,
    is_sharded_checkpoint,
    load_sharded_model_and_optimizer,
    resume_train_state,
    save_sharded_checkpoint,
)
from ace3.runtime.checkpoint.state_dicts import StateDicts
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.parallel.dims import ParallelDims
from ace3.runtime.process.distributed import DistContext, barrier

if TYPE_CHECKING:
    from ace3.runtime.checkpoint.background import BackgroundWriter
    from ace3.runtime.checkpoint.format import TrainingParts


class _WholeOrSharded(CheckpointFormat):
    """What the plain and sharded formats share: the strategy's state and the resume."""

    def __init__(self, ctx: DistContext, replicas: int, job: ShardedJob) -> None:
        self.ctx, self.replicas, self.job = ctx, replicas, job

    @property
    def state_dicts(self) -> StateDicts:
        return self.job.state_dicts

    def restore(self, ckpt: dict[str, Any], parts: TrainingParts) -> TrainState:
        ctx = self.ctx
        sharded = is_sharded_checkpoint(ckpt)
        if sharded:
            load_sharded_model_and_optimizer(ckpt, parts, ctx, self.state_dicts)
        else:
            load_plain_state(ckpt, parts, ctx, self.state_dicts)
        restore_schedule(ckpt, parts, ctx)
        if sharded:
            return resume_train_state(ckpt, parts, ctx, self.job)
        return resume_position(ckpt, ctx, self.replicas, parts)


class PlainFormat(_WholeOrSharded):
    """One ``.pt`` file written by rank 0 (every rank holds the whole state)."""

    kind: FormatKind = "plain"

    def name(self, step: int) -> str:
        return checkpoint_name(step)

    def save(
        self,
        parts: TrainingParts,
        path: Path,
        ranks: RankStates | None,
        background: BackgroundWriter | None = None,
    ) -> SavedCheckpoint | None:
        if not self.ctx.is_main:
            return None
        assert ranks is not None
        weights = self.state_dicts.full_weights(parts)
        payload = plain_payload(parts, weights, ranks, self.replicas)
        if background is not None:
            background.submit_state(payload, path)
            return None
        return save_atomic(payload, path)

    def save_model_file(self, parts: TrainingParts, path: Path, weights_only: bool) -> None:
        ctx = self.ctx
        if weights_only:
            barrier(ctx)
            if ctx.is_main:
                save_atomic(self.state_dicts.full_weights(parts), path)
        else:
            self.save(parts, path, gather_rank_states(ctx, parts))
        barrier(ctx)


class ShardedFormat(_WholeOrSharded):
    """Every rank writes its shards with DCP, rank 0 packs them into one ``.dcp.tar``."""

    kind: FormatKind = "sharded"

    def name(self, step: int) -> str:
        return sharded_checkpoint_name(step)

    def save(
        self,
        parts: TrainingParts,
        path: Path,
        ranks: RankStates | None,
        background: BackgroundWriter | None = None,
    ) -> SavedCheckpoint | None:
        return save_sharded_checkpoint(
            parts, self.ctx, path, ranks, self.job, background=background
        )

    def save_model_file(self, parts: TrainingParts, path: Path, weights_only: bool) -> None:
        """A full checkpoint is written sharded (a ``.dcp.tar`` archive, whatever ``path`` is
        called), staged outside the artifacts directory, which the worker uploads; the weights
        alone are gathered."""
        ctx = self.ctx
        if weights_only:
            state = self.state_dicts.full_weights(parts)
            if ctx.is_main:
                save_atomic(state, path)
        else:
            staging = shared_temp_dir(ctx)
            ranks = gather_rank_states(ctx, parts)
            save_sharded_checkpoint(parts, ctx, path, ranks, self.job, staging)
            barrier(ctx)
            if ctx.local_rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
        barrier(ctx)


def format_for(
    kind: FormatKind,
    ctx: DistContext,
    dims: ParallelDims,
    config: TrainingConfig,
    zero_stage: int,
    state_dicts: StateDicts,
) -> CheckpointFormat:
    """The checkpoint format a strategy names, over the state it supplies (a split model's
    gathered format takes the whole model later: :meth:`GatheredFormat.split_from`)."""
    if kind == "gathered":
        return GatheredFormat(dims, ctx)
    job = ShardedJob(config, dims.replica, zero_stage, state_dicts)
    if kind == "sharded":
        return ShardedFormat(ctx, dims.dp, job)
    return PlainFormat(ctx, dims.dp, job)
