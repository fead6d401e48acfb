"""Write one checkpoint for the whole job: gather RNG states, save on rank 0, report, barrier.

Every rank must call :func:`save_job_checkpoint` at the same step (it runs collectives). ZeRO
jobs write a sharded checkpoint instead (every rank writes its shards, rank 0 packs them into
``step-XXXXXXXX.dcp.tar``: :mod:`ace3.runtime.sharded_checkpoint`); the event is the same.
"""

from __future__ import annotations

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
from ace3.runtime.distributed import DistContext, barrier
from ace3.runtime.model_parallel import checkpoint_payload as model_parallel_payload
from ace3.runtime.reporting import EventWriter
from ace3.runtime.rng import capture_rng
from ace3.runtime.sharded_checkpoint import save_sharded_checkpoint, sharded_checkpoint_name


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
        events.write(
            CheckpointRecord(
                step=state.step,
                epoch=state.display_epoch(),
                name=saved.path.name,
                path=str(saved.path),
                sha256=saved.sha256,
                size_bytes=saved.size_bytes,
                metrics=finite_or_none(dict(state.last_metrics)),
            )
        )
        print(
            f"checkpoint {saved.path.name} saved "
            f"({saved.size_bytes} bytes, sha256 {saved.sha256[:12]})"
        )
    barrier(ctx)
    return saved
