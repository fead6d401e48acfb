"""Sharded checkpoints of ZeRO jobs: ``torch.distributed.checkpoint`` (DCP), packed in one file.

Saving (every rank, at the same step): each rank writes its own shards of the model and the
optimizer state with ``dcp.save`` into a staging directory next to the checkpoint
(``.step-XXXXXXXX.dcp.tar.parts/``); rank 0 adds ``train_state.pt`` (step, epoch, position,
RNG states of every rank, every replica's position in a streamed dataset, scheduler, loss
scaler, the metric carry: plain tensors and containers, ``torch.load(weights_only=True)``) and packs the directory into ONE uncompressed
tar, ``step-XXXXXXXX.dcp.tar``, written atomically (temporary file, fsync, rename) and hashed
like every checkpoint; the staging directory is removed. The checkpoint event names the tar.

What the DCP part holds is torch's own "distributed state dict" layout, the same at every
stage: ``{"model": {fqn: tensor}, "optimizer": {"state": {fqn: {...}}, "param_groups":
[...]}}``, given (and taken back) by the strategy's
:class:`~ace3.runtime.checkpoint.state_dicts.StateDicts`: at stages 2/3 the tensors are DTensor
shards, at stage 1 the model is replicated and each rank gives the optimizer state of the
parameters it owns. So DCP can re-shard on load: a checkpoint resumes on any number of ranks,
and at any ZeRO stage.

Loading: :func:`ace3.runtime.checkpoint.files.load_checkpoint` reads only ``train_state.pt``
(sha256 checked first). While the job is assembled, :func:`load_sharded_model_and_optimizer`
extracts the tar once per machine into a temporary directory, and every rank ``dcp.load``-s
the shards it needs for the current world size into its freshly sharded model and optimizer.

Resuming on another number of ranks (:func:`resume_train_state`): ``batch_in_epoch`` counts
micro-batches of the global ``batch_size``, which is the same at any world size: the loaders
shuffle with one permutation per epoch and give every rank an interleaved slice of it, so the
samples a resumed run has left are the ones the original run had left. What changes is which
rank sees which sample, and the per-rank RNG streams: ranks that existed get their saved RNG
state, new ranks start from ``rank_seed(seed + step, rank)``. The run continues from the same
point but is not bit-identical to an uninterrupted one (same world size: it is, as for plain
checkpoints). A streamed dataset's position belongs to its readers (each replica's shards,
workers and batch size): such a checkpoint resumes only with the data-parallel replicas and
``batch_size`` that wrote it.

Nothing of the archive runs as code: its members must be plain files (archive.py), its DCP
metadata (torch's pickle) and non-tensor values are read by
:mod:`ace3.runtime.checkpoint.dcp_reading`, which refuses what would run code or read outside
the checkpoint, and ``train_state.pt`` weights-only.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ace3.config import TrainingConfig
from ace3.runtime.checkpoint.archive import (
    SHARDED_FORMAT,
    TRAIN_STATE,
    extract,
    extracted,
    pack,
    read_train_state,
)
from ace3.runtime.checkpoint.background import stage_to_cpu
from ace3.runtime.checkpoint.files import SavedCheckpoint
from ace3.runtime.checkpoint.format import RankStates
from ace3.runtime.checkpoint.plain import (
    NO_OPTIMIZER_NOTE,
    data_position,
    schedule_state,
)
from ace3.runtime.checkpoint.shard_transfer import collect_shards
from ace3.runtime.loop.rng import rank_seed, restore_rng, seed_all
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.observe.log import ENGINE
from ace3.runtime.process.distributed import DistContext, barrier

if TYPE_CHECKING:
    from ace3.runtime.checkpoint.background import BackgroundWriter
    from ace3.runtime.checkpoint.format import TrainingParts
    from ace3.runtime.checkpoint.state_dicts import StateDicts


@dataclass(frozen=True)
class ShardedJob:
    """What the sharded format knows of its job: the config, this rank's data replica
    (index, count: which samples an epoch holds), the ZeRO stage the state is sharded at and
    the strategy's state (:class:`~ace3.runtime.checkpoint.state_dicts.StateDicts`)."""

    config: TrainingConfig
    replica: tuple[int, int]
    zero_stage: int
    state_dicts: StateDicts


def is_sharded_checkpoint(ckpt: dict[str, Any]) -> bool:
    """True for what :func:`read_train_state` returns (a sharded checkpoint's train state)."""
    return ckpt.get("format") == SHARDED_FORMAT and "archive" in ckpt


def _load_into(
    state_dicts: StateDicts, parts: TrainingParts, directory: Path, with_optimizer: bool
) -> None:
    """Load the DCP directory into the (sharded) model and optimizer, re-sharding as needed.
    A collective."""
    from ace3.runtime.checkpoint.dcp_reading import load_dcp

    state = state_dicts.sharded(parts, with_optimizer, for_load=True)
    load_dcp(state, directory)
    state_dicts.load_sharded(parts, state, with_optimizer)


# -- save ---------------------------------------------------------------------------------------
def train_state_payload(
    parts: TrainingParts,
    ctx: DistContext,
    config: TrainingConfig,
    ranks: RankStates,
    position_batches: int,
    zero_stage: int,
) -> dict[str, Any]:
    """What rank 0 stores next to the shards (plain containers, ``weights_only`` loadable)."""
    return {
        **parts.state.to_checkpoint(),
        **schedule_state(parts),
        **ranks.payload(),
        "world_size": ctx.world_size,
        "batch_size": config.batch_size,
        "batches_per_epoch": position_batches,
        "zero_stage": zero_stage,
        "has_optimizer": bool(config.save_optimizer),
        "format": SHARDED_FORMAT,
    }


def save_sharded_checkpoint(
    parts: TrainingParts,
    ctx: DistContext,
    path: Path,
    ranks: RankStates | None,
    job: ShardedJob,
    staging_root: Path | None = None,
    background: BackgroundWriter | None = None,
) -> SavedCheckpoint | None:
    """Write the sharded checkpoint ``path`` (a ``.dcp.tar``); every rank must call this at
    the same point. Returns the saved file on rank 0 (None elsewhere); the caller ends with a
    barrier before anyone reads it.

    The shards are staged in ``staging_root`` (default: next to ``path``; pass another
    directory when ``path``'s is watched, like the artifacts directory the worker uploads).

    With ``background`` (``async_save``; returns None, ``background.wait()`` gives the file):
    ``dcp.async_save`` stages the shards in CPU memory and writes them from a thread over a gloo
    group of its own; rank 0's thread then (every rank's shards written) packs the tar."""
    import torch.distributed.checkpoint as dcp

    staging = (staging_root or path.parent) / f".{path.name}.parts"
    if ctx.is_main and staging.exists():  # left by an attempt that died while saving
        shutil.rmtree(staging)
    barrier(ctx)
    config = job.config
    state = job.state_dicts.sharded(parts, config.save_optimizer, for_load=False)
    written: Any = None
    if background is None:
        dcp.save(state, checkpoint_id=str(staging))
    else:
        group = background.process_group() if ctx.world_size > 1 else None
        written = dcp.async_save(
            state, checkpoint_id=str(staging), process_group=group, no_dist=ctx.world_size == 1
        )
    if background is None:
        collect_shards(staging, ctx)
    if not ctx.is_main:
        if background is not None:
            background.submit(path.name, lambda: (written.result(), None)[1])
        return None
    assert ranks is not None
    position = parts.train_data.batches_per_epoch
    payload = train_state_payload(parts, ctx, config, ranks, position, job.zero_stage)

    def finish(payload: dict[str, Any]) -> SavedCheckpoint:
        if written is not None:
            written.result()
        torch.save(payload, staging / TRAIN_STATE)
        try:
            return pack(staging, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    if background is None:
        return finish(payload)
    staged = stage_to_cpu(payload)
    background.submit(path.name, lambda: finish(staged))
    return None


# -- load ---------------------------------------------------------------------------------------
def consolidate(path: Path) -> dict[str, Any]:
    """The whole checkpoint in one process, without a process group: the train state with the
    full ``model`` state dict and the ``optimizer`` state keyed by parameter name (for users
    who want plain weights out of a ``.dcp.tar``). Needs memory for the whole state."""
    from ace3.runtime.checkpoint.dcp_reading import load_whole_dcp

    path = Path(path)
    state = read_train_state(path)
    with tempfile.TemporaryDirectory(prefix="ace3-dcp-") as scratch:
        directory = Path(scratch) / "dcp"
        extract(path, directory)
        full = load_whole_dcp(directory)
    state.pop("archive", None)
    return {**state, **full}


def load_sharded_model_and_optimizer(
    ckpt: dict[str, Any], parts: TrainingParts, ctx: DistContext, state_dicts: StateDicts
) -> None:
    """Load a sharded checkpoint's weights and optimizer state into ``parts`` (any ZeRO stage,
    any world size). A collective: every rank calls it."""
    with_optimizer = bool(ckpt.get("has_optimizer"))
    with extracted(Path(ckpt["archive"]), ctx) as directory:
        _load_into(state_dicts, parts, directory, with_optimizer)
    if not with_optimizer and ctx.is_main:
        ENGINE.info(NO_OPTIMIZER_NOTE)


def resume_train_state(
    ckpt: dict[str, Any], parts: TrainingParts, ctx: DistContext, job: ShardedJob
) -> TrainState:
    """The position and RNG to continue from, converted when the world size changed (see
    the module docstring)."""
    config = job.config
    state = TrainState.from_checkpoint(ckpt)
    saved_world = int(ckpt["world_size"])
    saved_batch = int(ckpt.get("batch_size") or config.batch_size)
    rngs = ckpt.get("rng_per_rank") or []
    if ctx.rank < min(saved_world, len(rngs)):
        restore_rng(rngs[ctx.rank])
    else:
        seed_all(rank_seed(config.seed + state.step, ctx.rank))
    if saved_world == ctx.world_size and saved_batch == config.batch_size:
        state.data_position = data_position(ckpt, parts)
        return state
    if ckpt.get("data_per_replica"):
        raise ValueError(
            f"this checkpoint of a streamed dataset was written by {saved_world} process(es) "
            f"with batch_size {saved_batch}; this run has {ctx.world_size} with batch_size "
            f"{config.batch_size}: its position in the stream resumes only with the same "
            "processes and batch_size"
        )
    now_per_epoch = parts.train_data.batches_per_epoch
    saved_per_epoch = int(ckpt.get("batches_per_epoch") or now_per_epoch)
    if state.batch_in_epoch >= saved_per_epoch:
        position = now_per_epoch  # the epoch was finished: it stays finished
    else:
        samples = state.batch_in_epoch * saved_batch
        position = min(samples // config.batch_size, now_per_epoch)
    if ctx.is_main:
        ENGINE.info(
            f"note: this checkpoint was written by {saved_world} process(es) with batch_size "
            f"{saved_batch}; this run has {ctx.world_size} with batch_size {config.batch_size}: "
            f"continuing epoch {state.epoch + 1} after {position} global micro-batch(es) "
            f"(was {state.batch_in_epoch}). The remaining samples are the same, but each rank "
            "sees different ones and new ranks start new RNG streams, so the run is not "
            "bit-identical to an uninterrupted one"
        )
    state.batch_in_epoch = position
    return state
