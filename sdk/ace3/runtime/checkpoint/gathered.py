"""Checkpoints of jobs that split the model (pipeline stages, tensor shards): gathered on rank 0
into the plain format.

The file is what a data-parallel job with as many processes as this job has data-parallel
replicas would write: the full model state dict under the model's own parameter names, and the
optimizer state keyed as an optimizer over all the model's trainable parameters would key it
(``world_size`` is the number of replicas). So a pipeline or tensor-parallel checkpoint resumes
a plain job with that many processes, and the other way round, and resumes any other layout
with the same number of replicas (the weights are loaded into the whole model before it is
split: :meth:`GatheredFormat.split_from`, which the strategy calls with the whole model).

Gathering: every rank turns its tensors into full CPU tensors (``DTensor.full_tensor()``, a
collective over its tensor-parallel peers); the first tensor rank of every stage of replica 0
sends its share to rank 0 (``gather_object``, which every rank joins).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ace3.runtime.checkpoint.files import SavedCheckpoint, checkpoint_name, save_atomic
from ace3.runtime.checkpoint.format import CheckpointFormat, FormatKind, RankStates
from ace3.runtime.checkpoint.plain import (
    NO_OPTIMIZER_NOTE,
    gather_rank_states,
    restore_schedule,
    resume_position,
    schedule_state,
)
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.observe.log import ENGINE
from ace3.runtime.parallel.dims import ParallelDims
from ace3.runtime.process.distributed import DistContext, barrier

if TYPE_CHECKING:
    from ace3.runtime.checkpoint.background import BackgroundWriter
    from ace3.runtime.checkpoint.format import TrainingParts


def _trainable_names(model: nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad]


def _full(value: Any) -> Any:
    """A plain CPU tensor (a DTensor's full value: a collective)."""
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _like(value: Any, param: torch.Tensor) -> Any:
    """An optimizer state tensor placed like ``param`` (a DTensor shard for tensor parallel)."""
    if not isinstance(value, torch.Tensor) or value.shape != param.shape or value.ndim == 0:
        return value
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(
            value.to(param.device_mesh.device_type), param.device_mesh, param.placements
        )
    return value.to(param.device)


class GatheredFormat(CheckpointFormat):
    """The plain-format view of a model split over ranks: ``full_model`` names every tensor
    (every rank builds the whole model before it is split and hands it over with
    :meth:`split_from`)."""

    kind: FormatKind = "gathered"
    full_model: nn.Module

    def __init__(self, dims: ParallelDims, ctx: DistContext) -> None:
        self.dims, self.ctx = dims, ctx

    def split_from(self, full_model: nn.Module, ckpt: dict[str, Any] | None) -> None:
        """Before the split: the whole model (its names are the checkpoint's), with a resume's
        weights loaded into it."""
        self.full_model = full_model
        if ckpt is not None:
            self.load_weights(ckpt)

    def name(self, step: int) -> str:
        return checkpoint_name(step)

    def save(
        self,
        parts: TrainingParts,
        path: Path,
        ranks: RankStates | None,
        background: BackgroundWriter | None = None,
    ) -> SavedCheckpoint | None:
        payload = self.payload(parts, ranks)
        if payload is None:
            return None
        if background is not None:
            background.submit_state(payload, path)
            return None
        return save_atomic(payload, path)

    def save_model_file(self, parts: TrainingParts, path: Path, weights_only: bool) -> None:
        if weights_only:
            state, _ = self.full_state(parts)
            if self.ctx.is_main:
                save_atomic(state, path)
        else:
            self.save(parts, path, gather_rank_states(self.ctx, parts))
        barrier(self.ctx)

    def _local(self, parts: TrainingParts) -> tuple[dict[str, Any], dict[str, Any]]:
        """This rank's share: ``{name: tensor}`` of its parameters and buffers, and its
        optimizer state keyed by parameter name (full tensors; a collective over DTensors)."""
        by_id = {id(t): name for name, t in self.full_model.named_parameters()}
        by_id.update({id(t): name for name, t in self.full_model.named_buffers()})
        local = parts.model
        tensors = list(local.parameters()) + list(local.buffers())
        model_state = {by_id[id(t)]: _full(t) for t in tensors if id(t) in by_id}
        opt_state: dict[str, Any] = {}
        if parts.config.save_optimizer:
            params = [p for group in parts.optimizer.param_groups for p in group["params"]]
            for param in params:
                state = parts.optimizer.state.get(param, {})
                opt_state[by_id[id(param)]] = {key: _full(value) for key, value in state.items()}
        return model_state, opt_state

    def full_state(self, parts: TrainingParts) -> tuple[dict[str, Any], dict[str, Any]]:
        """The whole model state dict and the optimizer state dict of an unsplit job, on rank
        0 (empty dicts elsewhere). A collective."""
        # The key order, on every rank alike (a sharded module's state_dict runs FSDP's hooks).
        order = list(self.full_model.state_dict())
        model_state, opt_by_name = self._local(parts)
        ctx, dims = self.ctx, self.dims
        if ctx.world_size > 1:
            sends = dims.dp_rank == 0 and dims.tp_rank == 0  # one copy of every stage
            mine = (model_state, opt_by_name) if sends else ({}, {})
            gathered: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
            dist.gather_object(mine, gathered, dst=0)
            if not ctx.is_main:
                return {}, {}
            assert gathered is not None
            model_state, opt_by_name = {}, {}
            for states, opts in gathered:
                model_state.update(states)
                opt_by_name.update(opts)
        ordered = {key: model_state[key] for key in order if key in model_state}
        if not parts.config.save_optimizer:
            return ordered, {}
        names = _trainable_names(self.full_model)
        group = dict(parts.optimizer.state_dict()["param_groups"][0])
        group["params"] = list(range(len(names)))
        state = {i: opt_by_name[name] for i, name in enumerate(names) if opt_by_name.get(name)}
        return ordered, {"state": state, "param_groups": [group]}

    def payload(self, parts: TrainingParts, ranks: RankStates | None) -> dict[str, Any] | None:
        """The plain checkpoint on rank 0; None elsewhere. A collective."""
        model_state, optimizer_state = self.full_state(parts)
        if not self.ctx.is_main:
            return None
        assert ranks is not None
        dims = self.dims
        return {
            "model": model_state,
            "optimizer": optimizer_state,
            **schedule_state(parts),
            **parts.state.to_checkpoint(),
            **ranks.payload(),
            "world_size": dims.dp,  # the data-parallel replicas: what batch_in_epoch counts
            "format": 1,
            "model_parallel": {
                "parallelism": parts.config.parallelism,
                "processes": self.ctx.world_size,
                "pipeline_parallel_size": dims.pp,
                "tensor_parallel_size": dims.tp,
            },
        }

    # -- resume -----------------------------------------------------------------------------
    def load_weights(self, ckpt: dict[str, Any]) -> None:
        """The checkpoint's weights into the whole model, before it is split (the names are
        the model's); refuses a checkpoint of another number of replicas first."""
        if "archive" in ckpt or ckpt.get("format") == 2 or "model" not in ckpt:
            raise ValueError(
                "a sharded (.dcp.tar) checkpoint cannot resume a job that splits the model "
                "(pipeline or tensor parallel): convert it with "
                "ace3.runtime.checkpoint.sharded.consolidate(path) and resume from the plain "
                ".pt file"
            )
        saved = int(ckpt.get("world_size") or 0)
        if saved != self.dims.dp:
            raise ValueError(
                f"this checkpoint was written by a job of {saved} data-parallel replica(s) and "
                f"this job has {self.dims.dp}: a job that splits the model resumes checkpoints "
                "of as many replicas as it has (a plain job of that many processes, or another "
                "layout with that many replicas)"
            )
        self.full_model.load_state_dict(ckpt["model"])

    def restore(self, ckpt: dict[str, Any], parts: TrainingParts) -> TrainState:
        """Optimizer, scheduler, RNG and loop position (the weights were loaded before the
        split)."""
        ctx = self.ctx
        saved = ckpt.get("optimizer") or {}
        if saved:
            names = _trainable_names(self.full_model)
            by_name = {names[int(i)]: value for i, value in saved["state"].items()}
            full = {id(p): name for name, p in self.full_model.named_parameters()}
            params = [p for group in parts.optimizer.param_groups for p in group["params"]]
            local_state = {}
            for i, param in enumerate(params):
                state = by_name.get(full[id(param)])
                if state:
                    local_state[i] = {k: _like(v, param) for k, v in state.items()}
            group = {**saved["param_groups"][0], "params": list(range(len(params)))}
            parts.optimizer.load_state_dict({"state": local_state, "param_groups": [group]})
        elif ctx.is_main:
            ENGINE.info(NO_OPTIMIZER_NOTE)
        restore_schedule(ckpt, parts, ctx)
        return resume_position(ckpt, ctx, self.dims.dp, parts)
