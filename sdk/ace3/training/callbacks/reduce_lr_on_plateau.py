"""The built-in :class:`ReduceLROnPlateau`: lower the learning rate when a metric stops improving."""

from __future__ import annotations

from ace3.training.callbacks.base import CallbackError, Mode
from ace3.training.callbacks.checks import (
    check_bool,
    check_float,
    check_int,
    check_mode,
    check_str,
    where,
)
from ace3.training.callbacks.monitor import MonitorCallback

__all__ = ["ReduceLROnPlateau"]


class ReduceLROnPlateau(MonitorCallback):
    """Multiply the learning rate by ``factor`` when ``monitor`` has not improved by more than
    ``min_delta`` for ``patience`` epochs; never below ``min_lr``; then ignore the next
    ``cooldown`` epochs (improvements still update the best value) before counting again.

    Every optimizer parameter group is scaled; when a per-step schedule is active its base
    learning rates are scaled too, so the schedule goes on from the reduced values instead of
    undoing the reduction.
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        factor: float = 0.5,
        patience: int = 3,
        min_lr: float = 1e-7,
        mode: Mode = "auto",
        min_delta: float = 1e-4,
        cooldown: int = 0,
        verbose: bool = True,
    ) -> None:
        owner = "ReduceLROnPlateau"
        self.monitor = check_str(owner, "monitor", monitor)
        self.factor = check_float(owner, "factor", factor, 0.0)
        if not 0.0 < self.factor < 1.0:
            raise CallbackError(
                f"{where(owner, 'factor')}: expected a number in (0, 1) that multiplies the "
                f"learning rate, got {factor!r}"
            )
        self.patience = check_int(owner, "patience", patience, 0)
        self.min_lr = check_float(owner, "min_lr", min_lr, 0.0)
        self.mode: Mode = check_mode(owner, mode)
        self.min_delta = check_float(owner, "min_delta", min_delta, 0.0)
        self.cooldown = check_int(owner, "cooldown", cooldown, 0)
        self.verbose = check_bool(owner, "verbose", verbose)
        self._reset()

    def _reset(self) -> None:
        self._reset_monitor()
        self.best: float | None = None
        self.wait = 0
        self.cooldown_counter = 0

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._reset()
        self._run()

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        current = self._current(logs)
        if current is None:
            return
        improved = self._improved(current, self.best, self.min_delta)
        if improved:
            self.best, self.wait = current, 0
        if self.cooldown_counter > 0:  # the epochs right after a reduction do not count
            self.cooldown_counter -= 1
            self.wait = 0
            return
        if improved:
            return
        self.wait += 1
        if self.wait >= self.patience:
            new_lr = self._reduce()
            if new_lr is not None and self.verbose:
                print(
                    f"Epoch {epoch}: ReduceLROnPlateau: {self.monitor} has not improved for "
                    f"{self.wait} epoch(s); learning rate reduced to {new_lr:.6g}",
                    flush=True,
                )
            self.cooldown_counter = self.cooldown
            self.wait = 0

    def _reduce(self) -> float | None:
        """Scale every group above ``min_lr``; the first group's new rate, or None if none
        changed."""
        run = self._run()
        base_lrs = getattr(run.scheduler, "base_lrs", None)
        changed: float | None = None
        for index, group in enumerate(run.optimizer.param_groups):
            old = float(group["lr"])
            if old <= self.min_lr * (1.0 + 1e-6):
                continue
            new = max(old * self.factor, self.min_lr)
            group["lr"] = new
            if isinstance(base_lrs, list) and index < len(base_lrs):
                base_lrs[index] = float(base_lrs[index]) * (new / old)
            if changed is None:
                changed = new
        return changed
