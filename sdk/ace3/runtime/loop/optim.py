"""Build the job's optimizer and learning-rate schedule from its config, and drive the schedule.

Optimizers (``TrainingConfig.optimizer``), all with ``learning_rate``, ``weight_decay`` and,
for the Adam family, ``betas`` and ``eps``:

- ``adamw``: ``torch.optim.AdamW``, decoupled weight decay.
- ``adam``: ``torch.optim.Adam``, weight decay as an L2 penalty added to the gradient.
- ``sgd``: ``torch.optim.SGD`` with ``momentum``, L2 weight decay.
- ``memory_efficient_adam``: ``ace3.training.optimizers.MemoryEfficientAdam``, decoupled weight decay.
- ``adam8bit``: ``ace3.training.optimizers.Adam8bit``, decoupled weight decay (bitsandbytes' kernels on
  CUDA when it is installed).
- ``lion``, ``sophia``, ``galore_adamw``, ``adafactor``: :mod:`ace3.runtime.loop.extra_optimizers`.
- a ``torch.optim`` class name (``"Adadelta"``): :func:`build_torch_optimizer`, with
  ``learning_rate``, ``weight_decay`` (when not 0) and ``optimizer_kwargs`` only.

``optimizer_impl`` picks the kernels of torch's AdamW, Adam and SGD
(:func:`implementation_args`): ``auto`` is fused on CUDA when every parameter is a CUDA
floating tensor, else torch's own default.

Schedules (``TrainingConfig.lr_scheduler``) are built by :func:`build_scheduler` and driven by
the training loop through a :class:`ScheduleDriver`::

    optimizer = build_optimizer(model.parameters(), config)
    driver = build_scheduler(optimizer, config, total_steps)      # None: constant lr
    # resuming: optimizer.load_state_dict(...); driver.load_state_dict(ckpt["scheduler"])
    for each optimizer step:
        scaler.step(optimizer); scaler.update()                   # may skip on overflow
        driver.after_optimizer_step()
    after each validation:
        driver.after_validation(metrics)                          # {"val_loss": ..., ...}
    checkpoint: ckpt["scheduler"] = driver.state_dict()

Every schedule but ``plateau`` advances once per optimizer step of the loop, *including* a
step the float16 loss scaler skipped on overflow: the schedule's position stays equal to the
loop's step count, so horizons (``T_max``, ``total_steps``) end where the job ends and a resume
lines up exactly. Skips are rare and early, so this costs at most a few steps of warmup.
``plateau`` advances once per validation, on its ``monitor`` metric.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn
from torch.optim import lr_scheduler

from ace3.config import TrainingConfig
from ace3.config.extra_optimizers import EXTRA_OPTIMIZERS
from ace3.config.optimizer_choice import is_class_name
from ace3.errors import UnsupportedFeatureError
from ace3.training import schedulers
from ace3.training.optimizers.adam8bit import Adam8bit
from ace3.training.optimizers.memory_efficient_adam import MemoryEfficientAdam

__all__ = ["ScheduleDriver", "build_optimizer", "build_scheduler", "current_learning_rate"]

# torch warns when a scheduler's first step comes before any optimizer.step(); here that only
# happens when the loss scaler skipped the first step, which we advance past on purpose.
_EARLY_STEP_WARNING = r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`"


def build_optimizer(
    params: Iterable[nn.Parameter], config: TrainingConfig
) -> torch.optim.Optimizer:
    """The optimizer ``config.optimizer`` names, over the parameters with ``requires_grad``."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        raise ValueError("the model has no trainable parameters (requires_grad=True)")
    lr, wd = config.learning_rate, config.weight_decay
    if is_class_name(config.optimizer):
        return build_torch_optimizer(trainable, config)
    if config.optimizer in EXTRA_OPTIMIZERS:
        from ace3.runtime.loop.extra_optimizers import build_extra_optimizer

        return build_extra_optimizer(trainable, config)
    impl = implementation_args(trainable, config)
    adam_args: dict[str, Any] = {
        "lr": lr,
        "betas": tuple(config.betas),
        "eps": config.eps,
        "weight_decay": wd,
    }
    if config.optimizer == "adamw":
        return torch.optim.AdamW(trainable, **adam_args, **impl)
    if config.optimizer == "adam":
        return torch.optim.Adam(trainable, **adam_args, **impl)
    if config.optimizer == "sgd":
        return torch.optim.SGD(trainable, lr=lr, momentum=config.momentum, weight_decay=wd, **impl)
    if config.optimizer == "memory_efficient_adam":
        return MemoryEfficientAdam(trainable, **adam_args)
    if config.optimizer == "adam8bit":
        return Adam8bit(trainable, **adam_args)
    raise ValueError(
        f"unknown optimizer {config.optimizer!r}; choose adamw, adam, sgd, "
        "memory_efficient_adam, adam8bit, lion, sophia, galore_adamw or adafactor"
    )


def build_torch_optimizer(
    params: list[nn.Parameter], config: TrainingConfig
) -> torch.optim.Optimizer:
    """``torch.optim.<optimizer>(params, lr=learning_rate, [weight_decay], **optimizer_kwargs)``
    for a class-name optimizer (``"Adadelta"``): torch's defaults for everything else. JSON
    lists in ``optimizer_kwargs`` become tuples (``betas``, ``etas``)."""
    name = config.optimizer
    cls = getattr(torch.optim, name, None)
    if not isinstance(cls, type) or not issubclass(cls, torch.optim.Optimizer):
        raise UnsupportedFeatureError(
            f"optimizer={name!r}: the engine's torch ({torch.__version__}) has no "
            f"torch.optim.{name}"
        )
    kwargs = {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in config.optimizer_kwargs.items()
    }
    args: dict[str, Any] = {"lr": config.learning_rate}
    if config.weight_decay:
        args["weight_decay"] = config.weight_decay
    try:
        return cls(params, **args, **kwargs)
    except (TypeError, ValueError) as exc:
        if config.optimizer_kwargs:
            raise ValueError(
                f"optimizer_kwargs {dict(config.optimizer_kwargs)!r}: torch.optim.{name} "
                f"refused them: {exc}"
            ) from exc
        raise ValueError(f"optimizer={name!r}: torch.optim.{name} cannot optimize this model's "
                         f"parameters with lr={config.learning_rate}: {exc}") from exc  # fmt: skip


# Devices with torch's fused Adam/AdamW/SGD kernels (torch >= 2.4 has the CPU's too).
_FUSED_DEVICES = ("cuda", "cpu", "mps", "xpu")


def implementation_args(params: list[nn.Parameter], config: TrainingConfig) -> dict[str, bool]:
    """``fused`` / ``foreach`` for torch's AdamW, Adam and SGD from ``optimizer_impl``
    ({} leaves torch's default). ``auto``: fused when every parameter is a CUDA floating
    tensor; ``fused`` on parameters that cannot take it is refused with the reason."""
    impl = config.optimizer_impl
    if impl == "foreach":
        return {"foreach": True}
    if impl == "for_loop":
        return {"foreach": False}
    floating = all(torch.is_floating_point(p) for p in params)
    devices = {p.device.type for p in params}
    if impl == "auto":
        return {"fused": True} if floating and devices == {"cuda"} else {}
    unfit = sorted(devices - set(_FUSED_DEVICES))
    if not floating or unfit:
        what = f"parameters on {', '.join(unfit)}" if unfit else "non-floating parameters"
        raise UnsupportedFeatureError(
            f"optimizer_impl='fused': torch's fused {config.optimizer} has no kernel for {what}; "
            "use optimizer_impl='auto' or 'foreach'"
        )
    return {"fused": True}


def current_learning_rate(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate of the first parameter group (what the next step will use)."""
    return float(optimizer.param_groups[0]["lr"])


class ScheduleDriver:
    """One interface over every schedule, for the training loop.

    ``scheduler`` is the torch scheduler itself (hand it to hooks as ``RunContext.scheduler``).
    ``monitor`` is the metric a plateau schedule watches, None for per-step schedules.
    """

    def __init__(self, scheduler: Any, name: str, monitor: str | None = None) -> None:
        self.scheduler = scheduler
        self.name = name
        self.monitor = monitor

    @classmethod
    def wrap(cls, scheduler: Any) -> ScheduleDriver:
        """A driver for a scheduler built elsewhere (e.g. by the user, in a local run):
        ``ReduceLROnPlateau`` (torch's or ace3's) steps per validation on its ``monitor``
        (``val_loss`` for torch's), anything else once per optimizer step."""
        if isinstance(scheduler, ScheduleDriver):
            return scheduler
        if not hasattr(scheduler, "step") or not hasattr(scheduler, "state_dict"):
            raise TypeError(
                f"scheduler must be a torch.optim.lr_scheduler scheduler, got "
                f"{type(scheduler).__name__}"
            )
        name = getattr(scheduler, "spec_name", type(scheduler).__name__)
        if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau):
            return cls(scheduler, name, getattr(scheduler, "monitor", "val_loss"))
        return cls(scheduler, name)

    @property
    def per_step(self) -> bool:
        return self.monitor is None

    def after_optimizer_step(self) -> None:
        """Call once after every optimizer step of the loop (also one the scaler skipped)."""
        if not self.per_step:
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_EARLY_STEP_WARNING, category=UserWarning)
            self.scheduler.step()

    def after_validation(self, metrics: Mapping[str, float]) -> None:
        """Call once after every validation with its metrics; steps a plateau schedule."""
        if self.per_step:
            return
        if self.monitor not in metrics:
            available = ", ".join(sorted(metrics)) or "none"
            raise KeyError(
                f"lr_scheduler {self.name!r} monitors {self.monitor!r}, but validation "
                f"reported only: {available}; set its monitor to one of these"
            )
        value = float(metrics[self.monitor])  # type: ignore[index]  # a key of metrics: checked above
        if not math.isfinite(value):
            raise ValueError(
                f"lr_scheduler {self.name!r}: the monitored metric {self.monitor!r} is {value}; "
                "training has diverged (lower the learning rate or clip gradients)"
            )
        self.scheduler.step(value)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint stores to resume the schedule exactly."""
        return {"name": self.name, "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output and put the saved learning rates back on the
        optimizer, so the result does not depend on whether the optimizer's state was loaded
        before or after."""
        if not isinstance(state, Mapping) or "scheduler" not in state:
            raise ValueError("not a schedule state: expected ScheduleDriver.state_dict() output")
        if state.get("name") != self.name:
            raise ValueError(
                f"the checkpoint holds the state of lr_scheduler {state.get('name')!r} but this "
                f"job's lr_scheduler is {self.name!r}; resume with the same lr_scheduler"
            )
        self.scheduler.load_state_dict(dict(state["scheduler"]))
        last = self.scheduler.get_last_lr()
        groups = self.scheduler.optimizer.param_groups
        if len(last) != len(groups):
            raise ValueError(
                f"the saved schedule has {len(last)} learning rates but the optimizer has "
                f"{len(groups)} parameter groups"
            )
        for group, lr in zip(groups, last, strict=True):
            group["lr"] = lr


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainingConfig, total_steps: int
) -> ScheduleDriver | None:
    """The schedule ``config.lr_scheduler`` names, wrapped in a :class:`ScheduleDriver`.

    ``total_steps`` is the job's total number of optimizer steps; it is the default horizon
    of ``cosine`` (``T_max``), ``warmup_cosine`` and ``polynomial`` (``total_steps``) when the spec leaves
    it out. Returns None when no schedule is configured (constant learning rate).
    """
    spec = config.lr_scheduler
    if spec is None:
        return None
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ValueError(f"total_steps must be an integer >= 1, got {total_steps!r}")
    params = dict(spec.params)
    if spec.name == "cosine":
        params.setdefault("T_max", total_steps)
    elif spec.name in ("warmup_cosine", "polynomial"):
        params.setdefault("total_steps", total_steps)
    classes: dict[str, type] = {
        "cosine": schedulers.CosineAnnealingLR,
        "warmup_cosine": schedulers.WarmupCosineScheduler,
        "polynomial": schedulers.PolynomialDecayScheduler,
        "warmup": schedulers.WarmupScheduler,
        "step": schedulers.StepLR,
        "linear": schedulers.LinearLR,
        "exponential": schedulers.ExponentialLR,
        "plateau": schedulers.ReduceLROnPlateau,
    }
    try:
        scheduler = classes[spec.name](optimizer, **params)
    except ValueError as exc:
        raise ValueError(
            f"lr_scheduler {spec.name!r} with {params} (the job has {total_steps} optimizer "
            f"steps): {exc}"
        ) from exc
    return ScheduleDriver.wrap(scheduler)
