"""The plain checkpoint format (``step-XXXXXXXX.pt``, ``format`` 1) and what every format shares
on resume: the loss scaler, the schedule, the RNG states and the loop position.

A plain checkpoint holds plain tensors and containers only (``torch.load(weights_only=True)``):
the full-precision ``model`` state dict, the ``optimizer`` state dict, the scheduler and loss
scaler state, the train state (:class:`ace3.runtime.loop.train_state.TrainState`), every rank's RNG
states, the number of data-parallel replicas that wrote it (``world_size``) and, for a streamed
dataset, every replica's position in it (``data_per_replica``: its loader's state,
:mod:`ace3.runtime.data.train_source`), gathered like the RNG states (:class:`ace3.runtime.checkpoint.format.RankStates`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from ace3.runtime.checkpoint.format import RankStates
from ace3.runtime.loop.rng import capture_rng, restore_rng
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.observe.log import ENGINE
from ace3.runtime.process.distributed import DistContext, barrier

if TYPE_CHECKING:
    from ace3.runtime.checkpoint.format import TrainingParts
    from ace3.runtime.checkpoint.state_dicts import StateDicts

NO_OPTIMIZER_NOTE = (
    "note: the checkpoint holds no optimizer state (save_optimizer=False): the optimizer "
    "starts fresh, so the run will not match an uninterrupted one"
)


def gather_rank_states(ctx: DistContext, parts: TrainingParts) -> RankStates | None:
    """Every rank's RNG states and every replica's data position, on rank 0 (None elsewhere).
    A collective, behind a barrier."""
    barrier(ctx)
    replica, replicas = parts.train_data.replica
    mine = (capture_rng(), replica, parts.train_data.position())
    if ctx.world_size == 1:
        gathered: list[Any] | None = [mine]
    else:
        gathered = [None] * ctx.world_size if ctx.is_main else None
        dist.gather_object(mine, gathered, dst=0)
    if gathered is None:
        return None
    data: list[Any] = [None] * replicas
    for _, index, position in gathered:  # (every rank of a replica holds the same position)
        if data[index] is None:
            data[index] = position
    has_data = any(position is not None for position in data)
    return RankStates([rng for rng, _, _ in gathered], data if has_data else None)


def data_position(ckpt: dict[str, Any], parts: TrainingParts) -> Any:
    """This rank's replica's position in a streamed dataset from ``ckpt`` (None when it holds
    none); it resumes only with as many data-parallel replicas as wrote it."""
    positions = ckpt.get("data_per_replica")
    if not positions:
        return None
    replica, replicas = parts.train_data.replica
    if len(positions) != replicas:
        raise ValueError(
            f"this checkpoint holds the position of {len(positions)} data-parallel replica(s) "
            f"in a streamed dataset and this run has {replicas}: a streamed dataset resumes "
            f"with the processes that wrote it (resume it with {len(positions)} data-parallel "
            "replicas)"
        )
    return positions[replica]


def schedule_state(parts: TrainingParts) -> dict[str, Any]:
    """The loss scaler's and the scheduler's state (empty with ``save_scheduler=False``)."""
    keep = parts.config.save_scheduler
    scheduler, scaler = parts.scheduler, parts.scaler
    return {
        "scaler": scaler.state_dict() if keep and scaler.is_enabled() else {},
        "scheduler": scheduler.state_dict() if keep and scheduler is not None else {},
    }


def plain_payload(
    parts: TrainingParts, model_state: dict[str, Any], ranks: RankStates, replicas: int
) -> dict[str, Any]:
    """A data-parallel job's checkpoint: ``model_state`` holds full-precision weights whatever
    the precision level; the optimizer state is left out with ``save_optimizer=False``."""
    config = parts.config
    return {
        "model": model_state,
        "optimizer": parts.optimizer.state_dict() if config.save_optimizer else {},
        **schedule_state(parts),
        **parts.state.to_checkpoint(),
        **ranks.payload(),
        "world_size": replicas,
        "format": 1,
    }


def load_plain_state(
    ckpt: dict[str, Any], parts: TrainingParts, ctx: DistContext, state_dicts: StateDicts
) -> None:
    """A plain checkpoint's weights and optimizer state into the strategy's model and
    optimizer (a collective where they are sharded)."""
    optimizer = ckpt.get("optimizer") or None
    state_dicts.load_full(parts, ckpt["model"], optimizer)
    if not optimizer and ctx.is_main:
        ENGINE.info(NO_OPTIMIZER_NOTE)


def restore_schedule(ckpt: dict[str, Any], parts: TrainingParts, ctx: DistContext) -> None:
    """The loss scaler and the scheduler (a checkpoint without them is said)."""
    if ckpt.get("scaler") and parts.scaler.is_enabled():
        parts.scaler.load_state_dict(ckpt["scaler"])
    if parts.scheduler is not None:
        if ckpt.get("scheduler"):
            parts.scheduler.load_state_dict(ckpt["scheduler"])
        elif ctx.is_main:
            ENGINE.info("note: the checkpoint holds no scheduler state: the schedule restarts")


def resume_position(
    ckpt: dict[str, Any], ctx: DistContext, replicas: int, parts: TrainingParts
) -> TrainState:
    """The loop position, this rank's RNG states and its data position of a plain checkpoint,
    which resumes only with as many data-parallel replicas as wrote it (``batch_in_epoch``
    counts each replica's batches: another count would skip the wrong ones)."""
    saved = int(ckpt.get("world_size") or 0)
    if saved != replicas:
        raise ValueError(
            f"this checkpoint was written by {saved} processes and this run has {replicas} "
            "(counting data-parallel replicas: num_gpus * num_nodes / (pipeline_parallel_size "
            f"* tensor_parallel_size)): resume it with {saved}"
        )
    rngs = ckpt.get("rng_per_rank") or []
    if len(rngs) == ctx.world_size:
        restore_rng(rngs[ctx.rank])
    elif ctx.is_main:
        ENGINE.info(
            f"note: the checkpoint holds the random state of {len(rngs)} process(es), this "
            f"job has {ctx.world_size}: dropout and other random draws start fresh"
        )
    state = TrainState.from_checkpoint(ckpt)
    state.data_position = data_position(ckpt, parts)
    return state
