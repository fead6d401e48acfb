"""Write one checkpoint for the whole job: gather RNG states, save on rank 0, report, barrier;
and the files hooks ask for (:func:`save_model_file`).

Every rank must call :func:`save_job_checkpoint` at the same step (it runs collectives). ZeRO
jobs write a sharded checkpoint instead (every rank writes its shards, rank 0 packs them into
``step-XXXXXXXX.dcp.tar``: :mod:`ace3.runtime.sharded_checkpoint`); the event is the same.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ace3.config import TrainingConfig
from ace3.events import CheckpointRecord, finite_or_none
from ace3.runtime.build import Components
from ace3.runtime.checkpointing import (
    SavedCheckpoint,
    checkpoint_name,
    save_atomic,
)
from ace3.runtime.dcp_archive import sharded_checkpoint_name, shared_temp_dir
from ace3.runtime.distributed import DistContext, barrier
from ace3.runtime.model_parallel import checkpoint_payload as model_parallel_payload
from ace3.runtime.model_parallel import full_state
from ace3.runtime.model_parallel import rng_states as model_parallel_rng_states
from ace3.runtime.reporting import EventWriter
from ace3.runtime.rng import capture_rng
from ace3.runtime.sharded_checkpoint import save_sharded_checkpoint
from ace3.runtime.sharding import full_model_state_dict


def checkpoint_payload(
    parts: Components, rng_per_rank: list[Any], world_size: int, config: TrainingConfig
) -> dict[str, Any]:
    """Plain tensors and containers only (loadable with ``weights_only=True``).

    ``model`` holds full-precision weights whatever the precision level; the optimizer state is
    left out with ``save_optimizer=False``, the scheduler and loss-scaler state with
    ``save_scheduler=False`` (a resume then restarts them, and says so).
    """
    scheduler = parts.scheduler
    keep_schedule = config.save_scheduler
    return {
        "model": parts.precision.model_state_dict(parts.model),
        "optimizer": parts.optimizer.state_dict() if config.save_optimizer else {},
        "scaler": parts.scaler.state_dict() if keep_schedule and parts.scaler.is_enabled() else {},
        "scheduler": scheduler.state_dict() if keep_schedule and scheduler is not None else {},
        **parts.state.to_checkpoint(),
        "rng_per_rank": rng_per_rank,
        "world_size": world_size,
        "format": 1,
    }


def gather_rng(ctx: DistContext) -> list[Any] | None:
    """Every rank's RNG states, on rank 0 (None elsewhere). A collective, behind a barrier."""
    barrier(ctx)
    mine = capture_rng()
    gathered: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(mine, gathered, dst=0)
    return gathered


def save_job_checkpoint(
    parts: Components,
    ctx: DistContext,
    directory: Path,
    events: EventWriter,
    config: TrainingConfig,
) -> SavedCheckpoint | None:
    """Save ``step-XXXXXXXX.pt`` (``.dcp.tar`` for ZeRO jobs) atomically and append its
    checkpoint event (rank 0)."""
    gathered = gather_rng(ctx)
    state = parts.state
    saved = None
    if parts.model_parallel is not None:  # gathered on rank 0 into the plain format
        payload = model_parallel_payload(parts, ctx, gathered)
        if payload is not None:
            saved = save_atomic(payload, directory / checkpoint_name(state.step))
    elif parts.sharding is not None:
        path = directory / sharded_checkpoint_name(state.step)
        saved = save_sharded_checkpoint(parts, ctx, path, config, gathered)
    elif ctx.is_main:
        assert gathered is not None
        saved = save_atomic(
            checkpoint_payload(parts, gathered, ctx.world_size, config),
            directory / checkpoint_name(state.step),
        )
    if saved is not None:
        events.emit(
            CheckpointRecord,
            step=state.step,
            epoch=state.display_epoch(),
            name=saved.path.name,
            path=str(saved.path),
            sha256=saved.sha256,
            size_bytes=saved.size_bytes,
            metrics=finite_or_none(dict(state.last_metrics)),
        )
        print(
            f"checkpoint {saved.path.name} saved "
            f"({saved.size_bytes} bytes, sha256 {saved.sha256[:12]})"
        )
    barrier(ctx)
    return saved


def save_model_file(
    parts: Components, ctx: DistContext, config: TrainingConfig, path: Path, weights_only: bool
) -> None:
    """For hooks (ModelCheckpoint): the full training checkpoint, or the weights alone, at
    ``path`` (written by rank 0; every rank must call this at the same point). A ZeRO job
    writes its full checkpoint sharded (a ``.dcp.tar`` archive, whatever ``path`` is called)
    and gathers the weights for ``weights_only``."""
    if parts.model_parallel is not None:  # gathered on rank 0, the plain formats
        if weights_only:
            state, _ = full_state(parts, ctx)
            payload = state if ctx.is_main else None
        else:
            payload = model_parallel_payload(parts, ctx, model_parallel_rng_states(ctx))
        if ctx.is_main:
            save_atomic(payload, path)
        barrier(ctx)
        return
    if parts.sharding is not None:
        if weights_only:
            state = full_model_state_dict(parts.model, parts.sharding, everywhere=False)
            if ctx.is_main:
                save_atomic(state, path)
        else:  # staged outside the artifacts directory, which the worker uploads
            staging = shared_temp_dir(ctx)
            rngs = gather_rng(ctx)
            save_sharded_checkpoint(parts, ctx, path, config, rngs, staging)
            barrier(ctx)
            if ctx.local_rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
        barrier(ctx)
        return
    if weights_only:
        barrier(ctx)
        if ctx.is_main:
            save_atomic(parts.precision.model_state_dict(parts.model), path)
        barrier(ctx)
        return
    rngs = gather_rng(ctx)
    if ctx.is_main:
        assert rngs is not None
        save_atomic(checkpoint_payload(parts, rngs, ctx.world_size, config), path)
    barrier(ctx)
