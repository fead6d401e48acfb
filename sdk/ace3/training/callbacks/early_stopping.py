"""The built-in :class:`EarlyStopping`: stop when a metric stops improving, optionally restoring
the best weights."""

from __future__ import annotations

import math
from typing import Any

from ace3.training.callbacks.base import Mode
from ace3.training.callbacks.checks import check_bool, check_float, check_int, check_mode, check_str
from ace3.training.callbacks.monitor import MonitorCallback

__all__ = ["EarlyStopping"]


class EarlyStopping(MonitorCallback):
    """Stop training when ``monitor`` has not improved by more than ``min_delta`` for
    ``patience`` epochs in a row.

    ``mode``: ``min`` (lower is better), ``max``, or ``auto`` (``max`` for accuracy-like names).
    ``restore_best_weights=True`` keeps a CPU copy of the weights of the best epoch and loads
    it when training ends: at the epoch that stops training (or the last planned epoch), so the
    run's final checkpoint holds those weights; on every rank, so ranks stay identical. The
    copy is dropped once loaded. A missing metric gives one warning and no stop.
    """

    def __init__(
        self,
        monitor: str = "val_loss",
        patience: int = 5,
        min_delta: float = 0.0,
        mode: Mode = "auto",
        restore_best_weights: bool = False,
        verbose: bool = True,
    ) -> None:
        owner = "EarlyStopping"
        self.monitor = check_str(owner, "monitor", monitor)
        self.patience = check_int(owner, "patience", patience, 0)
        self.min_delta = check_float(owner, "min_delta", min_delta, 0.0)
        self.mode: Mode = check_mode(owner, mode)
        self.restore_best_weights = check_bool(owner, "restore_best_weights", restore_best_weights)
        self.verbose = check_bool(owner, "verbose", verbose)
        self._reset()

    def _reset(self) -> None:
        self._reset_monitor()
        self.wait = 0
        self.best: float | None = None
        self.best_epoch = 0
        self.stopped_epoch = 0
        self.best_weights: dict[str, Any] | None = None

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._reset()

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        current = self._current(logs)
        if current is None:
            return
        if self._improved(current, self.best, self.min_delta):
            self.best, self.best_epoch, self.wait = current, epoch, 0
            if self.restore_best_weights and self.model is not None:
                self.best_weights = {
                    key: value.detach().to("cpu", copy=True)
                    for key, value in self.model.state_dict().items()
                }
        else:
            self.wait += 1
            if self.wait >= self.patience:
                self.stopped_epoch = epoch
                self.model.stop_training = True
                if self.verbose:
                    best = "none" if self.best is None else f"{self.best:.6g}"
                    print(
                        f"Epoch {epoch}: early stopping: {self.monitor} has not improved by "
                        f"more than {self.min_delta:g} for {self.wait} epoch(s) (best {best} at "
                        f"epoch {self.best_epoch})",
                        flush=True,
                    )

    def _ace3_after_epoch_end(self, epoch: int) -> None:
        """Called by the engine after every callback's ``on_epoch_end``: on the run's last
        epoch (stopped by any callback, or the last planned one) restore the best weights now,
        so the final checkpoint holds them and no other callback saw them mid-epoch."""
        stopping = bool(getattr(self.model, "stop_training", False))
        if stopping or epoch >= self._planned_epochs():
            if self.best_epoch == epoch:
                self.best_weights = None  # the current weights are the best ones
            self._restore()

    def _planned_epochs(self) -> float:
        run = getattr(self, "_ace3_run", None)
        epochs = getattr(getattr(run, "config", None), "epoch_count", None)
        return float(epochs) if isinstance(epochs, int) else math.inf

    def on_train_end(self, logs: dict[str, float] | None = None) -> None:
        self._restore()  # training ended early some other way (max_steps, another callback)

    def _restore(self) -> None:
        if self.best_weights is not None and self.model is not None:
            self.model.load_state_dict(self.best_weights)
            if self.verbose:
                print(
                    f"EarlyStopping: restored the weights of epoch {self.best_epoch} "
                    f"({self.monitor}={self.best:.6g})",
                    flush=True,
                )
            self.best_weights = None
