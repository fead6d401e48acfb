"""Carrying a learning-rate schedule to a job: :func:`scheduler_spec` turns an
``ace3.training.schedulers`` schedule (a :class:`CarriedSchedule`) or one of the matching torch
classes into the :class:`ace3.config.specs.SchedulerSpec` a job rebuilds it from, and refuses
anything else with :class:`ace3.errors.UnsupportedFeatureError` (imports torch)."""

from __future__ import annotations

from typing import Any, ClassVar

from torch.optim import lr_scheduler

from ace3.config import ConfigProblem
from ace3.config.scheduler_params import check_scheduler_params
from ace3.config.specs import SchedulerSpec
from ace3.errors import UnsupportedFeatureError

# ReduceLROnPlateau's settings that a spec carries as torch keeps them.
PLATEAU_SETTINGS = ("mode", "factor", "patience", "threshold", "threshold_mode", "cooldown")


class CarriedSchedule:
    """``to_spec()`` from the spec name and the hyperparameters the class keeps."""

    spec_name: ClassVar[str]

    def _spec_params(self) -> dict[str, Any]:
        raise NotImplementedError

    def to_spec(self) -> SchedulerSpec:
        """This schedule as a :class:`SchedulerSpec` (its hyperparameters, not its optimizer)."""
        return SchedulerSpec(name=self.spec_name, params=self._spec_params())


def scheduler_spec(scheduler: Any) -> SchedulerSpec:
    """The :class:`SchedulerSpec` that rebuilds ``scheduler`` in a job.

    Accepts the ace3 schedulers and these torch classes (exactly, not subclasses):
    ``CosineAnnealingLR``, ``StepLR``, ``LinearLR``, ``ExponentialLR`` and
    ``ReduceLROnPlateau`` (which watches ``val_loss`` in a job). The schedule must not have
    advanced yet: a job starts it from the beginning. Anything else raises
    ``UnsupportedFeatureError`` naming what cannot be carried.
    """
    spec = scheduler.to_spec() if isinstance(scheduler, CarriedSchedule) else _torch_spec(scheduler)
    steps_done = scheduler.last_epoch
    if steps_done > 0:
        _refuse(
            "lr_scheduler",
            f"{type(scheduler).__name__} has already advanced {steps_done} time(s); a job "
            "starts its schedule from the beginning, so pass a scheduler that has not stepped",
        )
    return spec


def _torch_spec(scheduler: Any) -> SchedulerSpec:
    cls = type(scheduler)
    torch_classes: dict[type, tuple[str, tuple[str, ...]]] = {
        lr_scheduler.CosineAnnealingLR: ("cosine", ("T_max", "eta_min")),
        lr_scheduler.StepLR: ("step", ("step_size", "gamma")),
        lr_scheduler.LinearLR: ("linear", ("start_factor", "end_factor", "total_iters")),
        lr_scheduler.ExponentialLR: ("exponential", ("gamma",)),
    }
    if cls in torch_classes:
        name, keys = torch_classes[cls]
        return _spec_or_refuse(name, {key: getattr(scheduler, key) for key in keys})
    if cls is lr_scheduler.ReduceLROnPlateau:
        return _spec_or_refuse("plateau", _plateau_params(scheduler))
    _refuse(
        "lr_scheduler",
        f"{cls.__module__}.{cls.__qualname__} cannot be carried to a job; supported: the "
        "ace3.training.schedulers classes and torch's CosineAnnealingLR, StepLR, LinearLR, "
        "ExponentialLR and ReduceLROnPlateau",
    )
    raise AssertionError("unreachable")


def plateau_settings(scheduler: lr_scheduler.ReduceLROnPlateau) -> dict[str, Any]:
    """A plateau schedule's settings that a spec carries as they are (all but ``min_lr`` and
    ``monitor``)."""
    return {key: getattr(scheduler, key) for key in PLATEAU_SETTINGS}


def _plateau_params(scheduler: lr_scheduler.ReduceLROnPlateau) -> dict[str, Any]:
    min_lrs = {float(value) for value in scheduler.min_lrs}
    if len(min_lrs) > 1:
        _refuse(
            "min_lr",
            f"ReduceLROnPlateau has a different min_lr per parameter group ({scheduler.min_lrs});"
            " a job carries one min_lr for all groups",
        )
    if scheduler.eps != 1e-8:
        _refuse(
            "eps",
            f"ReduceLROnPlateau(eps={scheduler.eps!r}) cannot be carried: jobs use eps=1e-8",
        )
    return {**plateau_settings(scheduler), "min_lr": min_lrs.pop()}


def _spec_or_refuse(name: str, params: dict[str, Any]) -> SchedulerSpec:
    try:
        return SchedulerSpec(name=name, params=check_scheduler_params(name, params))
    except ValueError as exc:
        _refuse("lr_scheduler", f"cannot carry this scheduler to a job: {exc}")
        raise AssertionError("unreachable") from exc


def _refuse(field: str, reason: str) -> None:
    raise UnsupportedFeatureError(reason, [ConfigProblem(field=field, reason=reason)])
