"""The optimizer a model file builds itself: ``configure_optimizers(model)``.

A model file may define ``configure_optimizers(model)`` returning a ``torch.optim`` optimizer
over ``model``'s parameters, or ``(optimizer, scheduler)`` with a ``torch.optim.lr_scheduler``
scheduler of that optimizer (a dict ``{"optimizer": ..., "lr_scheduler": ...}`` too, as
Lightning's). The engine calls it on this rank's module *after* the strategy has placed, split
or sharded it (a pipeline stage, a tensor-parallel part, FSDP's sharded module), so the
optimizer holds the parameters that train. The config's ``optimizer``, ``learning_rate``,
``weight_decay``, ``optimizer_kwargs``, ``betas``, ``eps`` and ``momentum`` are then unused.

Each strategy adopts the result (:meth:`ace3.runtime.parallel.base.Strategy.make_optimizer`):
DDP, FSDP and the split layouts use it as it is; ZeRO-1 wraps it in a
``ZeroRedundancyOptimizer`` (:func:`ace3.runtime.parallel.sharding.zero_redundancy_optimizer`)
and moves the scheduler onto the wrapper. Refused, with the reason: float16/bfloat16 weights
with float32 master copies (``amp_level`` O2: the engine steps the masters, which the model
file never sees), and a scheduler together with the config's ``lr_scheduler``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ace3.config import TrainingConfig
from ace3.errors import UnsupportedFeatureError

ConfigureOptimizers = Callable[[nn.Module], Any]


@dataclass(frozen=True)
class Configured:
    """What ``configure_optimizers`` returned: the optimizer and its scheduler, if any."""

    optimizer: torch.optim.Optimizer
    scheduler: Any | None


def configure_optimizers(
    function: ConfigureOptimizers,
    model: nn.Module,
    config: TrainingConfig,
    master_weights: bool,
) -> Configured:
    """Call the model file's ``configure_optimizers(model)`` and check what it returned."""
    if master_weights:
        raise UnsupportedFeatureError(
            f"configure_optimizers with amp_level={config.amp_level!r}: the engine steps "
            "float32 master copies of the 16-bit weights, which the model file never sees; "
            "use amp_level='O1' (autocast, float32 weights) or O3, or drop configure_optimizers"
        )
    optimizer, scheduler = _unpack(function(model))
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "configure_optimizers(model) must return a torch.optim.Optimizer, (optimizer, "
            f"scheduler) or {{'optimizer': ..., 'lr_scheduler': ...}}, got "
            f"{type(optimizer).__name__}"
        )
    own = {id(param) for param in model.parameters()}
    foreign = sum(
        1 for group in optimizer.param_groups for p in group["params"] if id(p) not in own
    )
    if foreign:
        raise ValueError(
            f"configure_optimizers: the optimizer holds {foreign} parameter tensor(s) that are "
            "not the model's it was given; build it from that model's parameters (the engine "
            "calls it after placing, splitting or sharding the model)"
        )
    if scheduler is not None:
        if config.lr_scheduler is not None:
            raise ValueError(
                "configure_optimizers returned a scheduler and the config sets lr_scheduler "
                f"{config.lr_scheduler.name!r}: keep one of the two"
            )
        if not hasattr(scheduler, "step") or getattr(scheduler, "optimizer", None) is not optimizer:
            raise TypeError(
                "configure_optimizers: the scheduler must be a torch.optim.lr_scheduler "
                "scheduler of the optimizer returned with it"
            )
    return Configured(optimizer, scheduler)


def _unpack(result: Any) -> tuple[Any, Any]:
    if isinstance(result, Mapping):
        return result.get("optimizer"), result.get("lr_scheduler")
    if isinstance(result, tuple | list):
        if len(result) != 2:
            raise TypeError(
                f"configure_optimizers returned {len(result)} items; expected an optimizer or "
                "(optimizer, scheduler)"
            )
        return result[0], result[1]
    return result, None


def rebind_scheduler(scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Point ``scheduler`` at ``optimizer`` (a wrapper whose parameter groups carry the same
    hyperparameters and ``initial_lr``, such as ZeRO-1's), keeping its position. The wrapper's
    ``step`` is marked as torch's schedulers mark their optimizer's (they warn otherwise)."""
    scheduler.optimizer = optimizer
    step = optimizer.step
    if hasattr(step, "_wrapped_by_lr_sched"):
        return

    @functools.wraps(step)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True  # torch's own marker
        return step(*args, **kwargs)

    tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]  # torch's own marker
    optimizer.step = tracked  # as torch's schedulers patch it
