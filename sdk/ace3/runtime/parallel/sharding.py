"""Sharded data parallel (ZeRO stages 1-3) on PyTorch's own APIs.

- **Stage 1** (optimizer state sharded): the model is replicated under DDP, as at stage 0; the
  optimizer is a ``torch.distributed.optim.ZeroRedundancyOptimizer`` around the optimizer the
  config names, so each rank keeps (and updates) the state of its share of the parameters and
  broadcasts the updated parameters after the step.
- **Stage 2** (+ gradients): FSDP2 ``fully_shard(reshard_after_forward=False)``: parameters are
  stored sharded, all-gathered for the forward pass and kept gathered until the backward pass
  is done; gradients are reduce-scattered, so each rank holds its shard of the gradients and
  of the optimizer state.
- **Stage 3** (+ parameters): ``fully_shard(reshard_after_forward=True)``: parameters are freed
  again after each unit's forward pass and re-gathered for its backward pass.

Units: every child with parameters of the model's largest ``nn.Sequential`` becomes its own
FSDP unit, then the root (which takes the rest), so at most one layer's parameters are gathered
at a time at stage 3. A model without an ``nn.Sequential`` is one unit.

Offload (``cpu_offload``, ``offload_optimizer``, ``offload_parameters``: any of them) is FSDP's
``CPUOffloadPolicy``: sharded parameters, gradients and optimizer state live in (pinned) CPU
memory and the optimizer steps on the CPU. On a CPU device it has no effect and is skipped.

The strategies (:mod:`ace3.runtime.parallel.fsdp`, :mod:`ace3.runtime.parallel.split_model`)
drive gradient synchronisation: at stages 2/3 FSDP's reduce-scatter is off
(``set_requires_gradient_sync(False)``) for every micro-batch but the last of an optimizer
step.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ace3.config import TrainingConfig
from ace3.runtime.observe.state_size import training_state_bytes
from ace3.runtime.parallel.communication import fsdp_mixed_precision
from ace3.runtime.process.distributed import DistContext

if TYPE_CHECKING:
    from ace3.runtime.loop.precision import Precision

STAGE_SUMMARY = {
    1: "optimizer state sharded (DDP + ZeroRedundancyOptimizer)",
    2: "optimizer state + gradients sharded (FSDP fully_shard, reshard_after_forward=False)",
    3: "optimizer state + gradients + parameters sharded (FSDP fully_shard, "
    "reshard_after_forward=True)",
}


@dataclass(frozen=True)
class ShardingPlan:
    """How one run shards: the ZeRO ``stage`` it runs (1-3) and whether state is offloaded."""

    stage: int
    offload_requested: bool
    offload: bool  # requested and the device is not the CPU already
    implied: bool  # stage 3 because offload was asked for with zero_stage=0
    reduce_dtype: str | None = None  # communication_data_type: gradients reduce-scattered in it

    @property
    def fsdp(self) -> bool:
        """Stages 2 and 3 run on FSDP (sharded parameters, DTensors)."""
        return self.stage >= 2

    def describe(self, world_size: int) -> str:
        """For the log, e.g. ``ZeRO stage 3 over 2 rank(s): ...``."""
        text = f"ZeRO stage {self.stage} over {world_size} rank(s): {STAGE_SUMMARY[self.stage]}"
        if self.implied:
            text += "; stage 3 because offload was asked for with zero_stage=0"
        if self.offload:
            text += "; parameters, gradients and optimizer state offloaded to CPU memory"
        return text


def sharding_plan(config: TrainingConfig, device: torch.device) -> ShardingPlan | None:
    """The plan for ``config`` on ``device``; None for plain DDP (stage 0 without offload)."""
    stage = config.effective_zero_stage
    if stage == 0:
        return None
    return ShardingPlan(
        stage=stage,
        offload_requested=config.offload,
        offload=config.offload and device.type != "cpu",
        implied=stage != config.zero_stage,
        reduce_dtype=config.communication_data_type,
    )


def plan_notes(plan: ShardingPlan, config: TrainingConfig, world_size: int) -> list[str]:
    """What rank 0 logs about the plan (once, at build time)."""
    notes = [plan.describe(world_size)]
    if plan.offload_requested and not plan.offload:
        notes.append("offload has no effect on a CPU device: the state is in CPU memory already")
    return notes


# -- stages 2 and 3: FSDP -----------------------------------------------------------------------
def _units(model: nn.Module) -> list[nn.Module]:
    """The children with parameters of the model's largest ``nn.Sequential`` (by parameter
    count), in order: each becomes an FSDP unit below the root."""
    sequentials = [m for m in model.modules() if isinstance(m, nn.Sequential) and len(m) > 1]
    if not sequentials:
        return []
    largest = max(sequentials, key=lambda m: sum(p.numel() for p in m.parameters()))
    return [child for child in largest.children() if any(True for _ in child.parameters())]


def shard_model(model: nn.Module, plan: ShardingPlan, ctx: DistContext, mesh: Any = None) -> int:
    """Apply FSDP2 ``fully_shard`` to ``model`` in place (units, then the root); return the
    number of units below the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    if mesh is None:
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    options: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": plan.stage == 3}
    if plan.offload:
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda")
    options.update(fsdp_mixed_precision(plan.reduce_dtype))
    units = _units(model)
    for unit in units:
        fully_shard(unit, **options)
    fully_shard(model, **options)
    return len(units)


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Stages 2/3: reduce-scatter gradients in this backward pass (``enabled``) or keep
    accumulating them unsharded (every micro-batch but the last of a step)."""
    model.set_requires_gradient_sync(enabled)


def reshard(model: nn.Module) -> None:
    """Free the gathered parameters every FSDP module of ``model`` still holds (its sharded
    parameters become the registered ones again)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [param for param in model.parameters() if param.requires_grad]


def training_copy(model: nn.Module) -> nn.Module:
    """A copy to shard for an in-process run: FSDP changes a module in place (its class and
    parameters), and the caller's module must stay a plain module; the trained weights are
    written back at the end (:func:`write_back`)."""
    return copy.deepcopy(model)


# -- stage 1: ZeroRedundancyOptimizer -----------------------------------------------------------
def zero_redundancy_optimizer(
    params: Iterable[Any], template: torch.optim.Optimizer
) -> torch.optim.Optimizer:
    """A ``ZeroRedundancyOptimizer`` running ``template``'s class with its hyperparameters over
    each rank's share of ``params`` (parameters, or parameter groups: dicts) (``template`` is
    the optimizer the config names, built by ``ace3.runtime.loop.optim.build_optimizer`` over
    the same parameters, or the model file's ``configure_optimizers``'; it is discarded)."""
    import inspect

    from torch.distributed.optim import ZeroRedundancyOptimizer

    cls = type(template)
    accepted = inspect.signature(cls.__init__).parameters
    defaults = {key: value for key, value in template.defaults.items() if key in accepted}
    return ZeroRedundancyOptimizer(list(params), optimizer_class=cls, **defaults)


def is_zero_redundancy(optimizer: torch.optim.Optimizer) -> bool:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's state: ZeroRedundancyOptimizer's local one."""
    return optimizer.optim if is_zero_redundancy(optimizer) else optimizer


# -- whole-model views --------------------------------------------------------------------------
def full_model_state_dict(
    model: nn.Module, sharded: bool, everywhere: bool = True
) -> dict[str, Any]:
    """The unsharded model state (plain CPU tensors) on every rank, or only on rank 0 (an
    empty dict elsewhere) when not ``everywhere``. A collective at stages 2/3: every rank
    must call it."""
    if not sharded:
        return {key: value.detach().cpu() for key, value in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # cpu_offload=True gathers onto rank 0 only (and into CPU memory).
    options = StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
    state = get_model_state_dict(model, options=options)
    return {key: value.detach().cpu() for key, value in state.items()}


def rank0_float32_state(
    model: nn.Module, precision: Precision, is_main: bool
) -> dict[str, torch.Tensor]:
    """Every weight of ``model`` (what its ``state_dict()`` holds) as float32 CPU tensors on
    rank 0, an empty dict elsewhere: gathered onto rank 0 alone where a strategy sharded it
    (DTensors: a collective, so every rank calls this), else read from rank 0's own whole copy
    (its float32 masters under O2). Tensors that are not floating point keep their type. Each
    key gets a tensor of its own that no model or optimizer tensor shares, copied once at most
    (see :func:`float32_cpu_copies`)."""
    from torch.distributed.tensor import DTensor

    if any(isinstance(p, DTensor) for p in model.parameters()):
        state = full_model_state_dict(model, sharded=True, everywhere=False)
        if not is_main:
            return {}
        return float32_cpu_copies(state, _storages(model))
    if not is_main:
        return {}
    return float32_cpu_copies(precision.model_state_dict(model), None)


def _storage(tensor: torch.Tensor) -> int:
    return int(tensor.untyped_storage().data_ptr())


def _storages(model: nn.Module) -> set[int]:
    """The storages of the model's own tensors (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    tensors = [*model.parameters(), *model.buffers()]
    return {_storage(t.to_local() if isinstance(t, DTensor) else t) for t in tensors}


def float32_cpu_copies(state: dict[str, Any], live: set[int] | None) -> dict[str, torch.Tensor]:
    """``state``'s tensors as float32 (floating point ones) contiguous CPU tensors, each its own.

    ``state`` is emptied as it goes, so a tensor the cast replaces is freed at once. The cast
    copies a tensor on another device or of another type; one it leaves as is (``.to()`` returns
    the same tensor) is copied only when it is someone else's: a tensor of ``live`` (the model's
    own, where ``state`` was gathered into fresh tensors), any tensor where ``live`` is None (a
    state that holds the model's or the optimizer's own tensors), or one an earlier key already
    holds (tied weights)."""
    copies: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key in list(state):
        value = state.pop(key)
        if not isinstance(value, torch.Tensor):
            continue
        source = value.detach()
        tensor = source.to("cpu", torch.float32 if source.is_floating_point() else source.dtype)
        storage = _storage(tensor)
        borrowed = storage == _storage(source) and (live is None or storage in live)
        if borrowed or storage in seen:
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        copies[key] = tensor.contiguous()
        seen.add(_storage(copies[key]))
    return copies


def write_back(trained: nn.Module, original: nn.Module) -> None:
    """Load the trained (sharded) copy's weights into the caller's module. A collective."""
    state = full_model_state_dict(trained, sharded=True)
    with torch.no_grad():
        original.load_state_dict(state)


def local_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes this rank holds for parameters, gradients and optimizer state: the local shards of
    sharded (DTensor) tensors, and only this rank's ZeroRedundancyOptimizer state."""
    return training_state_bytes(model, local_optimizer(optimizer))
