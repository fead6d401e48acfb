"""What every parallelism strategy does for the engine; the loop never asks which one runs.

A strategy is made for one job attempt (:func:`ace3.runtime.parallel.strategy_for`), then:

1. **build**: :meth:`Strategy.prepare` places, casts and splits or shards the model (returns
   this rank's module), :meth:`Strategy.make_optimizer` builds the optimizer over it and
   :meth:`Strategy.wrap` sets :attr:`Strategy.forward`, what forward passes run through;
   a resume loads a checkpoint into all of it through :attr:`Strategy.checkpoints`;
2. **step** (:class:`ace3.runtime.loop.steps.StepRunner`): :meth:`before_step`,
   :meth:`forward_backward` (micro-batches, each under :meth:`sync_context`),
   :meth:`after_backward`, :meth:`clip_gradients` (or :meth:`grad_norm` alone);
3. **validation**: :meth:`evaluate`;
4. **checkpoints**: the strategy names its format (:attr:`checkpoint_format`: plain,
   gathered or sharded) and supplies the state it owns (:meth:`checkpoint_state`);
   :attr:`checkpoints`, the format (:mod:`ace3.runtime.checkpoint.format`), names, writes,
   loads and prunes the files (no strategy reads or writes one);
5. **end**: :meth:`state_bytes` (memory report), :meth:`finish`.

Data: every rank of one data replica reads the same batches; :attr:`dims` says which replica
this rank belongs to and how many there are, :attr:`per_rank_batch` how many samples each
loader batch holds.
"""

from __future__ import annotations

import contextlib
import functools
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _take_tensors, _unflatten_dense_tensors

from ace3.config import TrainingConfig
from ace3.runtime.checkpoint.format import CheckpointFormat, FormatKind
from ace3.runtime.checkpoint.formats import format_for
from ace3.runtime.checkpoint.state_dicts import StateDicts
from ace3.runtime.loop.configured_optimizer import configure_optimizers
from ace3.runtime.loop.extra_optimizers import (
    graph_keeping_backward,
    needs_grad_graph,
    plain_backward,
)
from ace3.runtime.loop.losses import batch_size_of, move_to_device
from ace3.runtime.loop.optim import build_optimizer
from ace3.runtime.loop.precision import Precision
from ace3.runtime.observe.state_size import training_state_bytes
from ace3.runtime.parallel.dims import ParallelDims
from ace3.runtime.parallel.state_dicts import ReplicatedStateDicts
from ace3.runtime.process.distributed import DistContext
from ace3.runtime.user_code import UserCode

if TYPE_CHECKING:
    from ace3.runtime.parallel.parts import StepParts

MicroBatches = list[tuple[Any, float]]  # (micro-batch, its loss weight); weights sum to 1
GRADIENT_BUCKET_BYTES = 25 << 20  # DDP's default bucket size


def average_over(
    tensors: list[torch.Tensor], replicas: int, group: Any = None, dtype: torch.dtype | None = None
) -> None:
    """Replace each tensor (in place) by its mean over the ``replicas`` ranks of ``group``:
    flattened in buckets of at most ``GRADIENT_BUCKET_BYTES`` per dtype, as DDP's (bounded
    extra memory), each divided before the sum, as DDP's default hook does (the same
    arithmetic). ``dtype`` (``communication_data_type``): each bucket is cast to it first, as
    DDP's fp16/bf16 compression hooks do. A collective."""
    for bucket in _take_tensors(tensors, GRADIENT_BUCKET_BYTES):
        flat = _flatten_dense_tensors(bucket)
        if dtype is not None:
            flat = flat.to(dtype)
        flat /= replicas
        dist.all_reduce(flat, group=group)
        for tensor, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
            tensor.copy_(synced)
        del flat


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """A norm as a plain float32 tensor (a DTensor's over its peers: one collective)."""
    full_tensor = getattr(norm, "full_tensor", None)
    return (full_tensor() if full_tensor is not None else norm).float()


def total_grad_norm(params: Any) -> torch.Tensor:
    """The 2-norm of every gradient of ``params`` together (torch's own, as clipping takes
    it; DTensor gradients' over their peers)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    return full_norm(torch.nn.utils.get_total_norm(grads))


class Strategy(ABC):
    """One parallelism: how the model is split, stepped, evaluated and checkpointed."""

    # Out of memory inside a step: a one-process run may halve its micro-batch and redo the
    # step; False where the step cannot be split (a pipeline's buffers have fixed shapes).
    splits_micro_batches: ClassVar[bool] = True

    def __init__(self, config: TrainingConfig, ctx: DistContext, dims: ParallelDims) -> None:
        self.config, self.ctx, self.dims = config, ctx, dims
        self.forward: nn.Module | None = None  # set by wrap()
        self.zero_stage = 0  # the ZeRO stage the run's state is sharded at (checkpoints say it)
        self.configured_scheduler: Any = None  # from the model file's configure_optimizers

    # -- layout ---------------------------------------------------------------------------------
    @property
    def per_rank_batch(self) -> int:
        """Samples in each loader batch of this rank: the global batch over the replicas."""
        replicas = self.dims.dp
        if self.config.batch_size % replicas:
            raise ValueError(
                f"batch_size ({self.config.batch_size}) must be divisible by the {replicas} "
                "data-parallel replicas of this job: it is the global batch, split evenly"
            )
        return self.config.batch_size // replicas

    def describe(self) -> list[str]:
        """What rank 0 logs about the layout at build time."""
        return []

    def in_place_oom_retry(self) -> bool:
        """Whether an out-of-memory step may be redone here with a smaller micro-batch (only
        when no peer can be waiting in a collective of the failed step)."""
        return self.ctx.world_size == 1

    # -- build ----------------------------------------------------------------------------------
    @abstractmethod
    def prepare(
        self,
        model: nn.Module,
        precision: Precision,
        user: UserCode,
        ckpt: dict[str, Any] | None,
        live_module: bool,
    ) -> nn.Module:
        """Place, cast and split or shard ``model``; return this rank's module (what the
        optimizer steps). ``live_module``: the caller keeps using ``model``."""

    def make_optimizer(
        self, model: nn.Module, precision: Precision, user: UserCode | None = None
    ) -> torch.optim.Optimizer:
        """The config's optimizer over :meth:`prepare`'s module, or the one the model file's
        ``configure_optimizers(model)`` builds (:meth:`adopt`; its scheduler, if any, is kept
        in :attr:`configured_scheduler`)."""
        if user is not None and user.configure_optimizers is not None:
            configured = configure_optimizers(
                user.configure_optimizers, model, self.config, precision.uses_master_weights
            )
            self.configured_scheduler = configured.scheduler
            return self.adopt(configured.optimizer, model, precision)
        return build_optimizer(precision.optimizer_parameters(model), self.config)

    def adopt(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, precision: Precision
    ) -> torch.optim.Optimizer:
        """The optimizer to step, from one ``configure_optimizers`` built over ``model``."""
        return optimizer

    def wrap(self, model: nn.Module) -> None:
        """Set :attr:`forward` (the module forward passes run through)."""
        self.forward = model

    # -- the step -------------------------------------------------------------------------------
    def before_step(self, parts: StepParts) -> None:
        """Before the step's first forward pass."""
        return None

    def sync_context(self, final: bool) -> contextlib.AbstractContextManager[Any]:
        """How the backward pass of a micro-batch synchronises gradients (``final``: the last
        micro-batch of the optimizer step)."""
        return contextlib.nullcontext()

    def forward_backward(self, chunks: MicroBatches, parts: StepParts) -> tuple[torch.Tensor, int]:
        """Forward and backward every micro-batch (gradients accumulate); return (the step's
        mean loss as a device tensor, the samples this rank ran)."""
        step_loss: torch.Tensor | None = None
        samples = 0
        assert self.forward is not None
        compute = parts.training_loss  # the model's own, or distillation's
        backward = graph_keeping_backward if needs_grad_graph(parts.optimizer) else plain_backward
        for i, (raw, weight) in enumerate(chunks):
            batch = move_to_device(raw, self.ctx.device)
            samples += batch_size_of(batch)
            with self.sync_context(final=i == len(chunks) - 1):
                with parts.precision.autocast():
                    loss = compute(self.forward, batch, parts.user.compute_loss).loss
                # (a weight of 1, one micro-batch a step, costs no extra operation)
                backward(parts.scaler.scale(loss * weight if weight != 1.0 else loss))
            part = loss.detach().float()
            part = part * weight if weight != 1.0 else part
            step_loss = part if step_loss is None else step_loss + part
        assert step_loss is not None
        return step_loss, samples

    def after_backward(self, parts: StepParts) -> None:
        """After the step's last backward pass, before clipping and the optimizer step."""
        return None

    def clip_gradients(self, parts: StepParts, max_norm: float) -> torch.Tensor:
        """Scale the gradients so that the whole model's gradient norm is at most ``max_norm``;
        return that norm before clipping (as :meth:`grad_norm`)."""
        params = parts.precision.clip_parameters(parts.model)
        return full_norm(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def grad_norm(self, parts: StepParts) -> torch.Tensor:
        """The whole model's gradient norm: a float32 device scalar, the same on every rank, no
        host read (a collective where gradients are sharded or split over ranks)."""
        return total_grad_norm(parts.precision.clip_parameters(parts.model))

    # -- validation -----------------------------------------------------------------------------
    @abstractmethod
    def evaluate(self, parts: StepParts, loader: Any) -> dict[str, float]:
        """``val_loss`` (and accuracy, user metrics) over the whole validation set."""

    # -- checkpoints ----------------------------------------------------------------------------
    # The format this strategy's checkpoints are written in (ace3.runtime.checkpoint.formats).
    checkpoint_format: ClassVar[FormatKind] = "plain"

    def checkpoint_state(self) -> StateDicts:
        """The state this strategy owns, in the form its format reads and writes (a split
        model's gathered format takes the whole model instead: ``split_from``)."""
        return ReplicatedStateDicts()

    @functools.cached_property
    def checkpoints(self) -> CheckpointFormat:
        """This job's checkpoint format: names, save, load (resume, roll back), hooks' model
        files, pruning. Made at first use, after the strategy is set up."""
        return format_for(
            self.checkpoint_format,
            self.ctx,
            self.dims,
            self.config,
            self.zero_stage,
            self.checkpoint_state(),
        )

    # -- the end --------------------------------------------------------------------------------
    def state_bytes(self, parts: StepParts) -> int:
        """Bytes this rank holds for parameters, gradients and optimizer state."""
        return training_state_bytes(parts.model, parts.optimizer)

    def finish(self, parts: StepParts) -> None:
        """After the last checkpoint (e.g. hand the trained weights to the caller's module)."""
        return None
