"""Learning-rate schedules: ``ace3.training.schedulers`` (imports torch; ``import ace3`` does not).

Each class is a ``torch.optim.lr_scheduler`` scheduler (a subclass of the torch class where
torch has one), so it works in any torch training loop, and each has ``to_spec()``: the
:class:`ace3.config.specs.SchedulerSpec` (name and hyperparameters, never the optimizer) that carries
it to a remote job, where ``ace3.runtime.loop.optim.build_scheduler`` rebuilds it.

When ACE3 drives a schedule, every schedule but ``plateau`` advances once per **optimizer
step** (not per epoch, not per micro-batch: with gradient accumulation, once per accumulated
step), so ``T_max``, ``step_size``, ``total_iters``, ``warmup_steps`` and ``total_steps`` count
optimizer steps. ``ReduceLROnPlateau`` advances once per validation, on its ``monitor``
metric. The learning rate a scheduler shows after ``k`` advances is the one the optimizer uses
for step ``k + 1``.

:func:`scheduler_spec` (:mod:`ace3.training.scheduler_specs`, importable from here) turns an ace3
scheduler, or one of the matching torch classes, into a spec, and refuses anything else with
:class:`ace3.errors.UnsupportedFeatureError`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch.optim import lr_scheduler

from ace3.config.scheduler_params import check_scheduler_params
from ace3.training.scheduler_specs import CarriedSchedule, plateau_settings, scheduler_spec

__all__ = [
    "CosineAnnealingLR",
    "ExponentialLR",
    "LinearLR",
    "PolynomialDecayScheduler",
    "ReduceLROnPlateau",
    "StepLR",
    "WarmupCosineScheduler",
    "WarmupScheduler",
    "scheduler_spec",
]


def _checked(name: str, **params: Any) -> dict[str, Any]:
    return check_scheduler_params(name, params)


class CosineAnnealingLR(CarriedSchedule, lr_scheduler.CosineAnnealingLR):
    """``torch.optim.lr_scheduler.CosineAnnealingLR``: from the optimizer's lr down to
    ``eta_min`` along a half cosine over ``T_max`` optimizer steps.

    As in torch, the curve is periodic: past ``T_max`` it climbs back up. Set ``T_max`` to
    the job's total optimizer steps (or use :class:`WarmupCosineScheduler`, which stays flat
    at its minimum).
    """

    spec_name = "cosine"

    def __init__(self, optimizer: torch.optim.Optimizer, T_max: int, eta_min: float = 0.0):
        params = _checked("cosine", T_max=T_max, eta_min=eta_min)
        super().__init__(optimizer, T_max=params["T_max"], eta_min=params["eta_min"])

    def _spec_params(self) -> dict[str, Any]:
        return {"T_max": self.T_max, "eta_min": self.eta_min}


class _WarmupThenDecay(CarriedSchedule, lr_scheduler.LRScheduler):
    """What :class:`WarmupCosineScheduler` and :class:`PolynomialDecayScheduler` share: a
    linear warmup to the peak over ``warmup_steps``, a decay to ``min_lr`` at ``total_steps``
    (the subclass's :meth:`decay`), then flat; a closed form of the step count, so a resumed
    schedule continues exactly."""

    warmup_steps: int
    total_steps: int
    min_lr: float

    def _start(
        self, optimizer: torch.optim.Optimizer, params: dict[str, Any], what: str, advice: str
    ) -> None:
        """Keep the checked step counts and ``min_lr``, refuse a ``min_lr`` above a group's
        peak (``what``, ``advice`` for the message), and start the torch scheduler."""
        self.warmup_steps = params["warmup_steps"]
        self.total_steps = params["total_steps"]
        self.min_lr = params["min_lr"]
        _check_min_lr_below_peaks(optimizer, self.min_lr, what, advice)
        super().__init__(optimizer)

    def decay(self, base_lr: float, progress: float) -> float:
        """The lr at ``progress`` (0 < progress < 1) of the way from the warmup's end to
        ``total_steps``."""
        raise NotImplementedError

    def lr_at(self, base_lr: float, steps_done: int) -> float:
        """The lr of the optimizer step that follows ``steps_done`` steps, for peak
        ``base_lr``."""
        k, w, total = steps_done + 1, self.warmup_steps, self.total_steps
        if k <= w:
            return base_lr * k / w
        if k >= total:
            return self.min_lr
        return self.decay(base_lr, (k - w) / (total - w))

    def get_lr(self) -> list[float]:
        return self._get_closed_form_lr()

    def _get_closed_form_lr(self) -> list[float]:
        return [self.lr_at(float(base), self.last_epoch) for base in self.base_lrs]

    def _shape_params(self) -> dict[str, Any]:
        raise NotImplementedError

    def _spec_params(self) -> dict[str, Any]:
        return {
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            **self._shape_params(),
            "min_lr": self.min_lr,
        }


class WarmupCosineScheduler(_WarmupThenDecay):
    """Linear warmup to ``max_lr``, cosine decay to ``min_lr`` at ``total_steps``, then flat.

    Optimizer step ``k`` (1-based) runs at::

        k <= warmup_steps:          max_lr * k / warmup_steps        (max_lr/warmup_steps ... max_lr)
        warmup_steps < k < total:   min_lr + (max_lr - min_lr) * (1 + cos(pi * p)) / 2,
                                    p = (k - warmup_steps) / (total_steps - warmup_steps)
        k >= total_steps:           min_lr

    so the first step already moves (no wasted step at lr 0), the last warmup step runs at
    ``max_lr`` and step ``total_steps`` at ``min_lr``. ``max_lr=None`` (default) uses each
    parameter group's own lr as its peak; a number sets every group's peak (and its
    ``initial_lr``). A closed form of the step count, so a resumed schedule continues exactly.
    """

    spec_name = "warmup_cosine"

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_steps: int,
        total_steps: int,
        max_lr: float | None = None,
        min_lr: float = 0.0,
    ):
        params = _checked(
            "warmup_cosine",
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            max_lr=max_lr,
            min_lr=min_lr,
        )
        self.max_lr: float | None = params["max_lr"]
        if self.max_lr is not None:
            for group in optimizer.param_groups:
                group["initial_lr"] = self.max_lr
        self._start(
            optimizer, params, "the peak learning rate", "lower min_lr or pass a larger max_lr"
        )

    def decay(self, base_lr: float, progress: float) -> float:
        return self.min_lr + (base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def _shape_params(self) -> dict[str, Any]:
        return {"max_lr": self.max_lr}


class PolynomialDecayScheduler(_WarmupThenDecay):
    """Linear warmup to the lr, polynomial decay to ``min_lr`` at ``total_steps``, then flat.

    Optimizer step ``k`` (1-based) of a parameter group with lr ``lr`` runs at::

        k <= warmup_steps:          lr * k / warmup_steps
        warmup_steps < k < total:   (lr - min_lr) * (1 - (k - w) / (total_steps - w))**power
                                    + min_lr,   w = warmup_steps
        k >= total_steps:           min_lr

    ``power=1`` is a linear decay, ``power=2`` a quadratic one (BERT's and many LLM recipes'
    "polynomial decay"). The same step convention as :class:`WarmupCosineScheduler`; a closed
    form of the step count, so a resumed schedule continues exactly.
    """

    spec_name = "polynomial"

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_steps: int,
        total_steps: int,
        power: float = 1.0,
        min_lr: float = 0.0,
    ):
        params = _checked(
            "polynomial",
            warmup_steps=warmup_steps,
            total_steps=total_steps,
            power=power,
            min_lr=min_lr,
        )
        self.power: float = params["power"]
        self._start(optimizer, params, "the learning rate", "lower min_lr")

    def decay(self, base_lr: float, progress: float) -> float:
        return (base_lr - self.min_lr) * (1.0 - progress) ** self.power + self.min_lr

    def _shape_params(self) -> dict[str, Any]:
        return {"power": self.power}


class WarmupScheduler(CarriedSchedule, lr_scheduler.LinearLR):
    """Linear warmup over ``warmup_steps`` optimizer steps, then the optimizer's lr.

    Step ``k`` runs at ``lr * min(1, k / warmup_steps)``: torch's ``LinearLR`` from
    ``1 / warmup_steps`` to 1 over ``warmup_steps - 1`` advances.
    """

    spec_name = "warmup"

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int):
        self.warmup_steps: int = _checked("warmup", warmup_steps=warmup_steps)["warmup_steps"]
        super().__init__(
            optimizer,
            start_factor=1.0 / self.warmup_steps,
            end_factor=1.0,
            total_iters=max(self.warmup_steps - 1, 1),
        )

    def _spec_params(self) -> dict[str, Any]:
        return {"warmup_steps": self.warmup_steps}


class StepLR(CarriedSchedule, lr_scheduler.StepLR):
    """``torch.optim.lr_scheduler.StepLR``: multiply the lr by ``gamma`` every ``step_size``
    optimizer steps."""

    spec_name = "step"

    def __init__(self, optimizer: torch.optim.Optimizer, step_size: int, gamma: float = 0.1):
        params = _checked("step", step_size=step_size, gamma=gamma)
        super().__init__(optimizer, step_size=params["step_size"], gamma=params["gamma"])

    def _spec_params(self) -> dict[str, Any]:
        return {"step_size": self.step_size, "gamma": self.gamma}


class LinearLR(CarriedSchedule, lr_scheduler.LinearLR):
    """``torch.optim.lr_scheduler.LinearLR``: scale the lr linearly from ``start_factor`` to
    ``end_factor`` over ``total_iters`` optimizer steps, then keep ``end_factor``."""

    spec_name = "linear"

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
    ):
        params = _checked(
            "linear", start_factor=start_factor, end_factor=end_factor, total_iters=total_iters
        )
        super().__init__(optimizer, **params)

    def _spec_params(self) -> dict[str, Any]:
        return {
            "start_factor": self.start_factor,
            "end_factor": self.end_factor,
            "total_iters": self.total_iters,
        }


class ExponentialLR(CarriedSchedule, lr_scheduler.ExponentialLR):
    """``torch.optim.lr_scheduler.ExponentialLR``: multiply the lr by ``gamma`` every
    optimizer step."""

    spec_name = "exponential"

    def __init__(self, optimizer: torch.optim.Optimizer, gamma: float):
        super().__init__(optimizer, gamma=_checked("exponential", gamma=gamma)["gamma"])

    def _spec_params(self) -> dict[str, Any]:
        return {"gamma": self.gamma}


class ReduceLROnPlateau(CarriedSchedule, lr_scheduler.ReduceLROnPlateau):
    """``torch.optim.lr_scheduler.ReduceLROnPlateau`` that knows which metric it watches.

    Multiplies the lr by ``factor`` (not below ``min_lr``) when ``monitor`` has not improved
    by ``threshold`` (relative, or absolute with ``threshold_mode="abs"``) for more than
    ``patience`` validations; ``mode="max"`` for metrics that should grow (accuracy). In a job
    it advances once per validation with that validation's ``monitor`` value; in your own loop
    call ``step(value)`` as with torch.
    """

    spec_name = "plateau"

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        mode: Literal["min", "max"] = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        min_lr: float = 0.0,
        monitor: str = "val_loss",
        *,
        threshold_mode: Literal["rel", "abs"] = "rel",
        cooldown: int = 0,
    ):
        params = _checked(
            "plateau",
            mode=mode,
            factor=factor,
            patience=patience,
            threshold=threshold,
            min_lr=min_lr,
            monitor=monitor,
            threshold_mode=threshold_mode,
            cooldown=cooldown,
        )
        self.monitor: str = params.pop("monitor")
        super().__init__(optimizer, **params)

    def _spec_params(self) -> dict[str, Any]:
        return {
            **plateau_settings(self),
            "min_lr": float(self.default_min_lr),
            "monitor": self.monitor,
        }


def _check_min_lr_below_peaks(
    optimizer: torch.optim.Optimizer, min_lr: float, what: str, advice: str
) -> None:
    """ValueError when ``min_lr`` is above a parameter group's peak rate (a schedule that
    decays towards it would rise instead)."""
    for index, group in enumerate(optimizer.param_groups):
        peak = float(group.get("initial_lr", group["lr"]))
        if peak < min_lr:
            raise ValueError(
                f"min_lr ({min_lr:g}) is above {what} of parameter group {index} ({peak:g}); "
                f"{advice}"
            )
