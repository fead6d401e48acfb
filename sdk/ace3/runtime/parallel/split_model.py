"""What the strategies that split the model (pipeline stages, tensor shards) share: the
whole model is built on every rank first (its names are the checkpoint's), a resume loads
into it before the split, and checkpoints are gathered into the plain format
(:mod:`ace3.runtime.checkpoint.gathered`).

Data parallelism over such a layout (``dp > 1``: several copies of the pipeline or of the
tensor-parallel group) averages each rank's gradients with the ranks that hold the same part
in the other replicas, after the step's last backward pass: one all-reduce per bucket of at
most ``GRADIENT_BUCKET_BYTES`` over the ``dp`` process group (not overlapped with the backward
pass, unlike DDP's), and rank 0 of each ``dp`` group broadcasts the buffers (BatchNorm
statistics) before every step, as DDP does. Clipping takes the norm of the whole model's
gradient: sharded (DTensor) gradients' norms over their tensor-parallel peers, summed over the
stages of the pipeline.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from ace3.runtime.checkpoint.format import FormatKind
from ace3.runtime.checkpoint.gathered import GatheredFormat
from ace3.runtime.loop.precision import Precision
from ace3.runtime.observe.log import ENGINE
from ace3.runtime.parallel.base import Strategy, average_over
from ace3.runtime.parallel.communication import reduction_dtype
from ace3.runtime.parallel.sharding import (
    local_state_bytes,
    plan_notes,
    reshard,
    set_gradient_sync,
    shard_model,
    sharding_plan,
)
from ace3.runtime.user_code import UserCode

if TYPE_CHECKING:
    from ace3.runtime.parallel.parts import StepParts


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (its storage), a plain tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def split_grad_norm(params: list[nn.Parameter], stage_group: Any = None) -> torch.Tensor:
    """The whole model's gradient norm: sharded (DTensor) gradients' norms over their peers,
    plain ones as they are, squares summed over the pipeline's stages (``stage_group``; None:
    no other stage). A device tensor: no host read."""
    grads = [p.grad for p in params if p.grad is not None]
    device = _local(grads[0]).device if grads else torch.device("cpu")
    squares = torch.zeros((), dtype=torch.float32, device=device)
    for grad in grads:
        norm = torch.linalg.vector_norm(grad.detach(), dtype=torch.float32)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        squares += norm**2
    if stage_group is not None and dist.get_world_size(stage_group) > 1:
        dist.all_reduce(squares, group=stage_group)
    return squares.sqrt()


def clip_split_grad_norm(
    params: list[nn.Parameter], max_norm: float, stage_group: Any = None
) -> torch.Tensor:
    """Scale the gradients so that the whole model's gradient norm (:func:`split_grad_norm`)
    is at most ``max_norm``; return the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    total = split_grad_norm(params, stage_group)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for grad in grads:
        _local(grad).mul_(coefficient.to(grad.dtype))
    return total


class SplitModel(Strategy):
    """A strategy whose ranks each hold part of the model."""

    checkpoint_format: ClassVar[FormatKind] = "gathered"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # ZeRO-2/3 over the replicas: FSDP over the dp dimension of the mesh (none with one).
        plan = sharding_plan(self.config, self.ctx.device)
        self.plan = plan if plan is not None and plan.fsdp and self.dims.dp > 1 else None
        if self.plan is not None:
            self.zero_stage = self.plan.stage

    def describe(self) -> list[str]:
        dims, notes = self.dims, []
        if dims.dp > 1 or (dims.pp > 1 and dims.tp > 1):
            notes.append(f"parallel layout: {dims.describe()}")
        if self.plan is not None:
            notes.extend(plan_notes(self.plan, self.config, dims.dp))
        elif self.config.effective_zero_stage:
            notes.append("ZeRO sharding has no effect with one data-parallel replica")
        return notes

    def shard_replicas(self, local: nn.Module) -> None:
        """ZeRO-2/3: shard this rank's part over its peers in the other replicas (FSDP2 over
        the ``dp`` mesh dimension; with tensor parallelism the parameters become 2-D
        DTensors)."""
        if self.plan is None:
            return
        mesh = self.dims.submesh(self.ctx.device.type, "dp")
        units = shard_model(local, self.plan, self.ctx, mesh=mesh)
        if self.ctx.is_main:
            ENGINE.info(f"FSDP over the replicas: {units} layer(s) + the root")

    def in_place_oom_retry(self) -> bool:
        return self.plan is None and super().in_place_oom_retry()

    def _dp_group(self) -> Any:
        return self.dims.group(self.ctx.device.type, "dp")

    def _stage_group(self) -> Any:
        """The ranks that hold the other stages of this rank's pipeline (None: one stage)."""
        return self.dims.group(self.ctx.device.type, "pp") if self.dims.pp > 1 else None

    def _sync_buffers(self, parts: StepParts) -> None:
        """Every replica takes replica 0's buffers (BatchNorm statistics), as DDP does."""
        if self.dims.dp > 1:
            dims = self.dims
            source = dims.global_rank(0, dims.pp_rank, dims.tp_rank)
            for buffer in parts.model.buffers():
                dist.broadcast(_local(buffer), src=source, group=self._dp_group())

    def after_evaluation(self, parts: StepParts) -> None:
        """ZeRO-2 keeps parameters gathered after a forward pass (reshard_after_forward=False):
        a validation pass has no backward to free them, so they are re-sharded here (the
        optimizer and checkpoints hold the sharded ones)."""
        if self.plan is not None:
            reshard(parts.model)

    def start_split(
        self, model: nn.Module, precision: Precision, ckpt: dict[str, Any] | None
    ) -> None:
        """Before the split: refuse what cannot run split, load a resume's weights."""
        if precision.needs_scaler:
            raise ValueError(
                f"float16 loss scaling is not implemented with {self.dims.describe()} (pipeline "
                "or tensor parallelism): use amp_dtype='bfloat16' or mixed_precision=False"
            )
        checkpoints = self.checkpoints
        assert isinstance(checkpoints, GatheredFormat)
        checkpoints.split_from(model, ckpt)  # (the whole model names the checkpoint's tensors)

    # -- data parallelism over the split model -------------------------------------------------
    def before_step(self, parts: StepParts) -> None:
        self._sync_buffers(parts)

    def sync_context(self, final: bool) -> contextlib.AbstractContextManager[Any]:
        if self.plan is not None:  # FSDP reduce-scatters in the step's last backward only
            # (the tensor-parallel step; a pipeline's PipelineStage drives FSDP itself, once
            # per schedule step, so once per accumulated batch)
            assert self.forward is not None
            set_gradient_sync(self.forward, final)
        return contextlib.nullcontext()

    def after_backward(self, parts: StepParts) -> None:
        """Average the gradients over the data-parallel replicas (see the module docstring;
        FSDP has reduce-scattered them already)."""
        replicas = self.dims.dp
        if replicas == 1 or self.plan is not None:
            return
        grads: list[torch.Tensor] = []
        for param in parts.model.parameters():
            if not param.requires_grad:
                continue
            if param.grad is None:  # unused in this replica's step: it still takes part
                param.grad = torch.zeros_like(param)
            grads.append(_local(param.grad))
        dtype = reduction_dtype(self.config.communication_data_type)
        average_over(grads, replicas, self._dp_group(), dtype=dtype)

    def clip_gradients(self, parts: StepParts, max_norm: float) -> torch.Tensor:
        return clip_split_grad_norm(
            parts.precision.clip_parameters(parts.model), max_norm, self._stage_group()
        )

    def grad_norm(self, parts: StepParts) -> torch.Tensor:
        return split_grad_norm(parts.precision.clip_parameters(parts.model), self._stage_group())

    def make_optimizer(
        self, model: nn.Module, precision: Precision, user: UserCode | None = None
    ) -> torch.optim.Optimizer:
        """This rank's part only (a pipeline stage, a tensor-parallel shard); the model file's
        ``configure_optimizers`` gets that part too."""
        if not precision.optimizer_parameters(model):
            raise ValueError(
                f"rank {self.ctx.rank}'s part of the model has no trainable parameters: choose "
                "other split points (pipeline_split_points) or fewer processes"
            )
        return super().make_optimizer(model, precision, user)

    def state_bytes(self, parts: StepParts) -> int:
        return local_state_bytes(parts.model, parts.optimizer)
