"""ace3.training.schedulers, their specs (SchedulerSpec validation, scheduler_spec), and the engine's
ScheduleDriver: stepping order, plateau on validation metrics, exact resume."""

from __future__ import annotations

import io
import itertools
import math
import warnings

import pytest
import torch
from pydantic import ValidationError
from torch import nn
from torch.optim import lr_scheduler

from ace3 import schedulers
from ace3.config import TrainingConfig
from ace3.config.specs import SchedulerSpec
from ace3.errors import UnsupportedFeatureError
from ace3.runtime.loop.optim import ScheduleDriver, build_optimizer, build_scheduler


def _optimizer(lr: float = 1.0) -> torch.optim.Optimizer:
    return torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=lr)


def _lrs(optimizer: torch.optim.Optimizer, scheduler, steps: int) -> list[float]:
    """The lr each of ``steps`` optimizer steps runs at, stepping as a training loop does."""
    seen = []
    for _ in range(steps):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return seen


# -- the schedules --------------------------------------------------------------------------


def test_warmup_cosine_shape() -> None:
    optimizer = _optimizer(lr=2.0)
    scheduler = schedulers.WarmupCosineScheduler(
        optimizer, warmup_steps=4, total_steps=12, min_lr=0.2
    )
    lrs = _lrs(optimizer, scheduler, 16)
    assert lrs[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0])  # step k of warmup: 2.0 * k / 4
    cosine = [0.2 + 1.8 * (1 + math.cos(math.pi * (k - 4) / 8)) / 2 for k in range(5, 12)]
    assert lrs[4:11] == pytest.approx(cosine)
    assert lrs[11:] == pytest.approx([0.2] * 5)  # step total_steps and after: min_lr, flat
    assert all(a >= b for a, b in itertools.pairwise(lrs[3:]))


def test_warmup_cosine_max_lr_overrides_the_optimizers_rate() -> None:
    optimizer = _optimizer(lr=0.01)
    scheduler = schedulers.WarmupCosineScheduler(optimizer, 2, 10, max_lr=1e-3, min_lr=1e-6)
    assert _lrs(optimizer, scheduler, 2) == pytest.approx([5e-4, 1e-3])
    with pytest.raises(ValueError, match="min_lr"):
        schedulers.WarmupCosineScheduler(_optimizer(lr=1e-4), 2, 10, min_lr=1e-3)
    with pytest.raises(ValueError, match="warmup_steps"):
        schedulers.WarmupCosineScheduler(_optimizer(), 20, 10)


def test_warmup_then_constant() -> None:
    optimizer = _optimizer(lr=0.8)
    scheduler = schedulers.WarmupScheduler(optimizer, warmup_steps=4)
    assert _lrs(optimizer, scheduler, 7) == pytest.approx([0.2, 0.4, 0.6, 0.8, 0.8, 0.8, 0.8])
    optimizer = _optimizer(lr=0.8)
    assert _lrs(optimizer, schedulers.WarmupScheduler(optimizer, 1), 3) == [0.8] * 3


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (
            lambda o: schedulers.CosineAnnealingLR(o, T_max=5, eta_min=0.1),
            lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=5, eta_min=0.1),
        ),
        (
            lambda o: schedulers.StepLR(o, step_size=2, gamma=0.5),
            lambda o: lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
        ),
        (
            lambda o: schedulers.LinearLR(o, start_factor=0.25, total_iters=4),
            lambda o: lr_scheduler.LinearLR(o, start_factor=0.25, total_iters=4),
        ),
        (
            lambda o: schedulers.ExponentialLR(o, gamma=0.9),
            lambda o: lr_scheduler.ExponentialLR(o, gamma=0.9),
        ),
    ],
)
def test_torch_backed_schedules_match_torch(ours, theirs) -> None:
    optimizer = _optimizer()
    scheduler = ours(optimizer)
    assert isinstance(scheduler, lr_scheduler.LRScheduler)
    mine = _lrs(optimizer, scheduler, 8)
    reference_optimizer = _optimizer()
    assert mine == _lrs(reference_optimizer, theirs(reference_optimizer), 8)


def test_plateau_reduces_after_patience() -> None:
    optimizer = _optimizer(lr=1.0)
    scheduler = schedulers.ReduceLROnPlateau(optimizer, factor=0.5, patience=1, min_lr=0.3)
    for value in (1.0, 1.0, 1.0):
        scheduler.step(value)
    assert optimizer.param_groups[0]["lr"] == 0.5
    for value in (1.0, 1.0):
        scheduler.step(value)
    assert optimizer.param_groups[0]["lr"] == 0.3  # not below min_lr
    assert scheduler.monitor == "val_loss"


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda o: schedulers.CosineAnnealingLR(o, T_max=0), "T_max"),
        (lambda o: schedulers.CosineAnnealingLR(o, T_max=2.5), "T_max"),
        (lambda o: schedulers.StepLR(o, step_size=3, gamma=-1), "gamma"),
        (lambda o: schedulers.LinearLR(o, start_factor=0.0), "start_factor"),
        (lambda o: schedulers.ExponentialLR(o, gamma=True), "gamma"),
        (lambda o: schedulers.WarmupScheduler(o, 0), "warmup_steps"),
        (lambda o: schedulers.ReduceLROnPlateau(o, mode="down"), "mode"),
        (lambda o: schedulers.ReduceLROnPlateau(o, factor=1.0), "factor"),
        (lambda o: schedulers.ReduceLROnPlateau(o, monitor=""), "monitor"),
    ],
)
def test_bad_arguments_name_the_argument(make, named) -> None:
    with pytest.raises(ValueError, match=named):
        make(_optimizer())


# -- specs ----------------------------------------------------------------------------------


ALL = [
    (lambda o: schedulers.CosineAnnealingLR(o, T_max=7, eta_min=1e-3), "cosine"),
    (lambda o: schedulers.WarmupCosineScheduler(o, 3, 9, max_lr=0.5, min_lr=0.01), "warmup_cosine"),
    (lambda o: schedulers.WarmupScheduler(o, 3), "warmup"),
    (lambda o: schedulers.StepLR(o, 3, gamma=0.5), "step"),
    (lambda o: schedulers.LinearLR(o, 0.5, 0.9, 4), "linear"),
    (lambda o: schedulers.ExponentialLR(o, 0.8), "exponential"),
]


@pytest.mark.parametrize(("make", "name"), ALL)
def test_spec_rebuilds_the_same_schedule_in_the_engine(make, name) -> None:
    optimizer = _optimizer(lr=0.1)
    scheduler = make(optimizer)
    spec = scheduler.to_spec()
    assert spec.name == name and schedulers.scheduler_spec(scheduler) == spec
    assert "optimizer" not in spec.params
    config = TrainingConfig.model_validate_json(
        TrainingConfig(optimizer="sgd", learning_rate=0.1, lr_scheduler=spec).model_dump_json()
    )
    assert config.lr_scheduler == spec
    expected = _lrs(optimizer, scheduler, 12)
    rebuilt = build_optimizer(nn.Linear(2, 1).parameters(), config)
    driver = build_scheduler(rebuilt, config, total_steps=12)
    seen = []
    for _ in range(12):
        seen.append(rebuilt.param_groups[0]["lr"])
        rebuilt.step()
        driver.after_optimizer_step()
    assert seen == pytest.approx(expected, rel=1e-12)


def test_plateau_spec_carries_its_settings() -> None:
    scheduler = schedulers.ReduceLROnPlateau(
        _optimizer(), mode="max", factor=0.5, patience=2, min_lr=1e-5, monitor="val_accuracy"
    )
    spec = schedulers.scheduler_spec(scheduler)
    assert spec.name == "plateau" and spec.params["monitor"] == "val_accuracy"
    driver = build_scheduler(_optimizer(), TrainingConfig(lr_scheduler=spec), total_steps=10)
    rebuilt = driver.scheduler
    assert (rebuilt.mode, rebuilt.factor, rebuilt.patience) == ("max", 0.5, 2)
    assert rebuilt.min_lrs == [1e-5] and driver.monitor == "val_accuracy"


def test_torch_schedulers_become_specs() -> None:
    optimizer = _optimizer()
    cases = {
        lr_scheduler.CosineAnnealingLR(optimizer, 10, 0.01): ("cosine", {"T_max": 10}),
        lr_scheduler.StepLR(optimizer, 4, 0.3): ("step", {"gamma": 0.3}),
        lr_scheduler.LinearLR(optimizer, total_iters=3): ("linear", {"total_iters": 3}),
        lr_scheduler.ExponentialLR(optimizer, 0.9): ("exponential", {"gamma": 0.9}),
        lr_scheduler.ReduceLROnPlateau(optimizer, patience=4): ("plateau", {"patience": 4}),
    }
    for scheduler, (name, some_params) in cases.items():
        spec = schedulers.scheduler_spec(scheduler)
        assert spec.name == name and some_params.items() <= spec.params.items()


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda o: lr_scheduler.OneCycleLR(o, max_lr=1.0, total_steps=10), "OneCycleLR"),
        (lambda o: lr_scheduler.ReduceLROnPlateau(o, eps=1e-3), "eps"),
        (lambda o: lr_scheduler.ReduceLROnPlateau(o, factor=0.0), "factor"),
        (lambda o: lr_scheduler.StepLR(o, step_size=0), "step_size"),
    ],
)
def test_scheduler_spec_refuses_what_a_job_cannot_rebuild(make, named) -> None:
    with pytest.raises(UnsupportedFeatureError, match=named) as caught:
        schedulers.scheduler_spec(make(_optimizer()))
    assert caught.value.problems


def test_scheduler_spec_refuses_a_schedule_that_has_advanced() -> None:
    optimizer = _optimizer()
    scheduler = schedulers.StepLR(optimizer, 2)
    optimizer.step()
    scheduler.step()
    with pytest.raises(UnsupportedFeatureError, match="already advanced 1"):
        schedulers.scheduler_spec(scheduler)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("cosine", {"T_max": 0}, "'T_max' must be an integer >= 1"),
        ("cosine", {"tmax": 5}, "no parameter 'tmax'; its parameters are T_max, eta_min"),
        ("warmup_cosine", {"total_steps": 5}, "needs parameter 'warmup_steps'"),
        ("warmup_cosine", {"warmup_steps": 9, "total_steps": 5}, "'warmup_steps' (9) must be"),
        ("warmup_cosine", {"warmup_steps": 1, "max_lr": 1e-4, "min_lr": 1e-3}, "'min_lr'"),
        ("step", {"step_size": True}, "'step_size' must be an integer"),
        ("exponential", {"gamma": "0.9"}, "'gamma' must be a number > 0"),
        ("exponential", {"gamma": float("nan")}, "'gamma' must be a number > 0"),
        ("linear", {"end_factor": 1.5}, "'end_factor' must be a number >= 0 and <= 1"),
        ("plateau", {"threshold_mode": "relative"}, "'threshold_mode' must be one of"),
        ("plateau", {"patience": -1}, "'patience' must be an integer >= 0"),
    ],
)
def test_scheduler_spec_validation_names_the_parameter(name, params, message) -> None:
    with pytest.raises(ValidationError) as caught:
        SchedulerSpec(name=name, params=params)
    assert message in str(caught.value)
    with pytest.raises(ValidationError, match="lr_scheduler"):  # also inside a TrainingConfig
        TrainingConfig(lr_scheduler={"name": name, "params": params})


def test_scheduler_spec_normalises_numbers() -> None:
    spec = SchedulerSpec(name="cosine", params={"T_max": 5, "eta_min": 0})
    assert spec.params == {"T_max": 5, "eta_min": 0.0} and isinstance(spec.params["eta_min"], float)
    with pytest.raises(ValidationError, match="name"):
        SchedulerSpec(name="onecycle", params={})


# -- the engine's driver --------------------------------------------------------------------


def test_build_scheduler_defaults_and_horizon() -> None:
    assert build_scheduler(_optimizer(), TrainingConfig(), total_steps=10) is None
    cosine = TrainingConfig(lr_scheduler=SchedulerSpec(name="cosine"))
    assert build_scheduler(_optimizer(), cosine, total_steps=40).scheduler.T_max == 40
    warm = TrainingConfig(lr_scheduler={"name": "warmup_cosine", "params": {"warmup_steps": 5}})
    driver = build_scheduler(_optimizer(), warm, total_steps=30)
    assert isinstance(driver.scheduler, schedulers.WarmupCosineScheduler)
    assert driver.scheduler.total_steps == 30 and driver.per_step
    with pytest.raises(ValueError, match="total_steps must be an integer >= 1"):
        build_scheduler(_optimizer(), cosine, total_steps=0)
    with pytest.raises(ValueError, match="the job has 3 optimizer steps"):
        build_scheduler(_optimizer(), warm, total_steps=3)  # warmup_steps 5 > total_steps 3


def test_driver_does_not_warn_when_the_scaler_skipped_the_first_step() -> None:
    """A GradScaler skips optimizer.step() on overflow; the schedule still advances (its
    position stays the loop's step count) and torch's ordering warning is not raised."""
    optimizer = _optimizer()
    driver = build_scheduler(
        optimizer, TrainingConfig(lr_scheduler={"name": "step", "params": {"step_size": 1}}), 5
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        driver.after_optimizer_step()  # step 1 skipped: no optimizer.step() before
        optimizer.step()
        driver.after_optimizer_step()
    assert driver.scheduler.last_epoch == 2
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)


def test_plateau_driver_steps_on_validation_only() -> None:
    optimizer = _optimizer(lr=1.0)
    spec = {"name": "plateau", "params": {"patience": 0, "factor": 0.5, "monitor": "val_acc"}}
    driver = build_scheduler(optimizer, TrainingConfig(lr_scheduler=spec), total_steps=100)
    assert not driver.per_step and driver.monitor == "val_acc"
    for _ in range(5):
        optimizer.step()
        driver.after_optimizer_step()  # no-op for plateau
    assert optimizer.param_groups[0]["lr"] == 1.0
    driver.after_validation({"val_acc": 0.5, "val_loss": 1.0})
    driver.after_validation({"val_acc": 0.5, "val_loss": 1.0})  # no improvement, patience 0
    assert optimizer.param_groups[0]["lr"] == 0.5
    with pytest.raises(
        KeyError, match=r"monitors 'val_acc'.*reported only: val_accuracy, val_loss"
    ):
        driver.after_validation({"val_loss": 1.0, "val_accuracy": 0.5})
    with pytest.raises(ValueError, match="diverged"):
        driver.after_validation({"val_acc": float("nan")})


def test_per_step_driver_ignores_validation() -> None:
    optimizer = _optimizer()
    driver = build_scheduler(optimizer, TrainingConfig(lr_scheduler={"name": "cosine"}), 10)
    driver.after_validation({})
    assert driver.scheduler.last_epoch == 0


def test_wrap_user_schedulers() -> None:
    optimizer = _optimizer()
    assert ScheduleDriver.wrap(lr_scheduler.StepLR(optimizer, 2)).per_step
    plateau = ScheduleDriver.wrap(lr_scheduler.ReduceLROnPlateau(optimizer))
    assert plateau.monitor == "val_loss"
    ours = ScheduleDriver.wrap(schedulers.ReduceLROnPlateau(optimizer, monitor="val_accuracy"))
    assert ours.monitor == "val_accuracy" and ours.name == "plateau"
    assert ScheduleDriver.wrap(ours) is ours
    with pytest.raises(TypeError, match="scheduler must be"):
        ScheduleDriver.wrap(object())


SPECS = [
    {"name": "cosine", "params": {"eta_min": 0.01}},
    {"name": "warmup_cosine", "params": {"warmup_steps": 4, "min_lr": 0.001}},
    {"name": "warmup", "params": {"warmup_steps": 6}},
    {"name": "step", "params": {"step_size": 3, "gamma": 0.5}},
    {"name": "linear", "params": {"start_factor": 0.2, "total_iters": 8}},
    {"name": "exponential", "params": {"gamma": 0.9}},
    {"name": "plateau", "params": {"patience": 1, "factor": 0.5}},
]


def _run(config: TrainingConfig, steps: range, state=None) -> tuple[list[float], dict]:
    """The training loop's order: build -> (resume) -> step, driver; validate every 3 steps."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = build_optimizer(model.parameters(), config)
    driver = build_scheduler(optimizer, config, total_steps=20)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        driver.load_state_dict(state["scheduler"])
    seen = []
    inputs = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    for step in steps:
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()
        driver.after_optimizer_step()
        if step % 3 == 2:
            driver.after_validation({"val_loss": 1.0 + (step % 2) * 0.01})
    buffer = io.BytesIO()
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": driver.state_dict(),
    }
    torch.save(checkpoint, buffer)
    buffer.seek(0)
    return seen, torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("spec", SPECS, ids=[spec["name"] for spec in SPECS])
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam8bit"])
def test_resumed_schedule_continues_exactly(spec, optimizer_name) -> None:
    config = TrainingConfig(optimizer=optimizer_name, learning_rate=0.1, lr_scheduler=spec)
    straight, _ = _run(config, range(20))
    first, checkpoint = _run(config, range(9))
    second, _ = _run(config, range(9, 20), state=checkpoint)
    assert first + second == straight
    assert len(set(straight)) > 1  # the schedule did move


def test_driver_state_restores_rates_in_either_order() -> None:
    config = TrainingConfig(
        optimizer="sgd", lr_scheduler={"name": "warmup", "params": {"warmup_steps": 10}}
    )
    _, checkpoint = _run(config, range(5))
    optimizer = build_optimizer(nn.Linear(4, 1).parameters(), config)
    driver = build_scheduler(optimizer, config, total_steps=20)
    driver.load_state_dict(checkpoint["scheduler"])  # before the optimizer's state this time
    assert optimizer.param_groups[0]["lr"] == pytest.approx(config.learning_rate * 6 / 10)


def test_driver_refuses_another_schedules_state() -> None:
    optimizer = _optimizer()
    cosine = build_scheduler(optimizer, TrainingConfig(lr_scheduler={"name": "cosine"}), 10)
    step = build_scheduler(
        _optimizer(), TrainingConfig(lr_scheduler={"name": "step", "params": {"step_size": 2}}), 10
    )
    with pytest.raises(ValueError, match="holds the state of lr_scheduler 'cosine'"):
        step.load_state_dict(cosine.state_dict())
    with pytest.raises(ValueError, match="not a schedule state"):
        step.load_state_dict({"last_epoch": 3})
