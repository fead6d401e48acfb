"""Callbacks: code that runs inside the training loop at fixed points (Keras-style).

Subclass :class:`Callback` and override any of its ``on_*`` methods, or use a built-in one:
:class:`EarlyStopping`, :class:`ModelCheckpoint`, :class:`ReduceLROnPlateau`::

    early_stopping = ace3.callbacks.EarlyStopping(monitor="val_loss", patience=5)
    trainer = ace3.Trainer(callbacks=[early_stopping])

Where they run: in a local run, the very objects you pass; in a remote job, copies rebuilt by
the engine inside every rank (see :mod:`ace3.training.callback_transport` for what can be carried).
Callbacks run on every rank with the same arguments, so every rank takes the same decisions;
what they print appears once (only rank 0's output is kept).

This module does not import torch (the engine calls the callbacks with torch objects).
"""

from __future__ import annotations

import inspect
import math
import string
import warnings
from pathlib import Path
from typing import Any, Literal

from ace3.errors import ACE3Error

__all__ = [
    "BUILTIN_CALLBACKS",
    "Callback",
    "CallbackError",
    "EarlyStopping",
    "ModelCheckpoint",
    "ReduceLROnPlateau",
    "init_params",
    "resolve_mode",
]

Mode = Literal["auto", "min", "max"]

# Metric names that are better when larger, for mode="auto" (as in Keras, plus a few).
_HIGHER_IS_BETTER = ("acc", "auc", "f1", "precision", "recall", "iou", "score")


class CallbackError(ValueError, ACE3Error):
    """A callback's argument or spec is invalid; the message names it and the fix."""


class Callback:
    """Base class of every callback. Every method is a no-op; override the ones you need.

    The engine calls, on every rank and in this order::

        on_train_begin(logs)
          per epoch:  on_epoch_begin(epoch, logs)
                        per optimizer step: on_batch_begin(batch, logs) ... on_batch_end(batch, logs)
                      on_epoch_end(epoch, logs)
        on_train_end(logs)

    - ``epoch`` counts from 1; ``batch`` is the 0-based optimizer step within the epoch.
    - ``on_batch_end`` logs: ``loss`` (this rank's mean loss of the step), ``step`` (optimizer
      steps done), ``learning_rate``, ``batch_size`` (samples on this rank).
    - ``on_epoch_end`` logs: the epoch's metrics, identical on every rank: ``train_loss``
      (= ``epoch_train_loss``, the epoch's mean training loss) and, with validation,
      ``val_loss``, ``val_accuracy`` and any ``val_<name>`` from the model's
      ``compute_metrics``.
    - ``on_train_end`` logs: the last metrics; the other hooks get an empty dict.

    ``self.model`` is the live ``nn.Module`` being trained (not the DDP wrapper). Setting
    ``self.model.stop_training = True`` stops training: after the current step when set in a
    batch hook, after the epoch when set in an epoch hook.

    Overriding ``on_batch_begin`` or ``on_batch_end`` makes the loop read the loss and agree on
    stopping after every step (a small cost per step); leave them alone when you do not need
    them.
    """

    #: the nn.Module being trained; set by the engine before on_train_begin
    model: Any = None

    def set_model(self, model: Any) -> None:
        self.model = model

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None: ...

    def on_train_end(self, logs: dict[str, float] | None = None) -> None: ...

    def on_epoch_begin(self, epoch: int, logs: dict[str, float] | None = None) -> None: ...

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None: ...

    def on_batch_begin(self, batch: int, logs: dict[str, float] | None = None) -> None: ...

    def on_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None: ...


# -- argument checks ----------------------------------------------------------------------------


def _where(owner: str, argument: str) -> str:
    return f"{owner}({argument}=...)"


def _check_str(owner: str, argument: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CallbackError(
            f"{_where(owner, argument)}: expected a non-empty string, got {value!r}"
        )
    return value


def _check_bool(owner: str, argument: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise CallbackError(f"{_where(owner, argument)}: expected True or False, got {value!r}")
    return value


def _check_int(owner: str, argument: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CallbackError(
            f"{_where(owner, argument)}: expected an integer >= {minimum}, got {value!r}"
        )
    return value


def _check_float(owner: str, argument: str, value: Any, minimum: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < minimum
    ):
        raise CallbackError(
            f"{_where(owner, argument)}: expected a finite number >= {minimum}, got {value!r}"
        )
    return float(value)


def _check_mode(owner: str, value: Any) -> Mode:
    if value not in ("auto", "min", "max"):
        raise CallbackError(
            f"{_where(owner, 'mode')}: expected 'auto', 'min' or 'max', got {value!r}"
        )
    return value


def resolve_mode(monitor: str, mode: Mode) -> Literal["min", "max"]:
    """``auto``: ``max`` for accuracy-like metrics (acc, auc, f1, ...), else ``min``."""
    if mode != "auto":
        return mode
    name = monitor.lower()
    return "max" if any(word in name for word in _HIGHER_IS_BETTER) else "min"


# -- shared machinery of the built-ins ----------------------------------------------------------


class _MonitorCallback(Callback):
    """A callback that watches one epoch metric: improvement test and the missing-metric
    warning (given once per training, as Keras does, instead of failing the run)."""

    monitor: str
    mode: Mode

    def _reset_monitor(self) -> None:
        self._warned_missing = False

    def _improved(self, current: float, best: float | None, min_delta: float) -> bool:
        if math.isnan(current):
            return False
        if best is None:
            return True
        if resolve_mode(self.monitor, self.mode) == "min":
            return current < best - min_delta
        return current > best + min_delta

    def _current(self, logs: dict[str, float] | None) -> float | None:
        logs = logs or {}
        value = logs.get(self.monitor)
        if value is None:
            if not getattr(self, "_warned_missing", False):
                self._warned_missing = True
                available = ", ".join(sorted(logs)) or "none"
                hint = (
                    " (val_* metrics need validation: a validation dataset or validation_split)"
                    if self.monitor.startswith("val_")
                    else ""
                )
                warnings.warn(
                    f"{type(self).__name__}: the monitored metric {self.monitor!r} is not in "
                    f"the epoch logs (available: {available}); it does nothing until it "
                    f"appears. Set monitor= to one of the available names{hint}.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return None
        return float(value)

    def _run(self) -> Any:
        run = getattr(self, "_ace3_run", None)
        if run is None:
            raise CallbackError(
                f"{type(self).__name__} runs inside the ACE3 training engine: pass it to a "
                "trainer (ace3.Trainer(callbacks=[...])) instead of calling it directly"
            )
        return run


# -- EarlyStopping ------------------------------------------------------------------------------


class EarlyStopping(_MonitorCallback):
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
        self.monitor = _check_str(owner, "monitor", monitor)
        self.patience = _check_int(owner, "patience", patience, 0)
        self.min_delta = _check_float(owner, "min_delta", min_delta, 0.0)
        self.mode: Mode = _check_mode(owner, mode)
        self.restore_best_weights = _check_bool(owner, "restore_best_weights", restore_best_weights)
        self.verbose = _check_bool(owner, "verbose", verbose)
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
        epochs = getattr(getattr(run, "config", None), "epochs", None)
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


# -- ModelCheckpoint ----------------------------------------------------------------------------


def _template_fields(owner: str, filepath: str) -> list[str]:
    """The named fields of a ``str.format`` template; positional or dotted fields are refused."""
    try:
        parsed = list(string.Formatter().parse(filepath))
    except ValueError as exc:
        raise CallbackError(
            f"{_where(owner, 'filepath')}: {filepath!r} is not a valid format template ({exc}); "
            "write fields as {epoch:02d} or {val_loss:.2f}, and double literal braces"
        ) from None
    names = []
    for _, field, _, _ in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            raise CallbackError(
                f"{_where(owner, 'filepath')}: field {{{field}}} in {filepath!r} must be a plain "
                "name such as {epoch:02d} or {val_loss:.2f} (no positions, dots or indexes)"
            )
        names.append(field)
    return names


class ModelCheckpoint(_MonitorCallback):
    """Save the model at the end of every epoch (or only when ``monitor`` improves).

    ``filepath`` is a Python format template: ``{epoch:02d}`` and any epoch-log key
    (``{val_loss:.2f}``, ``{val_accuracy:.3f}``, ...). ``save_best_only=True`` saves only when
    ``monitor`` beats its best so far (a missing metric gives one warning and no save).
    ``save_weights_only=True`` writes the model's ``state_dict`` alone; otherwise the full
    training checkpoint (model, optimizer, scheduler, scaler, RNG: resumable). Files load with
    ``torch.load(path, weights_only=True)``.

    A relative path is relative to the working directory of a local run; for a remote job the
    SDK writes the files under the same local path as the job runs.
    """

    def __init__(
        self,
        filepath: str,
        monitor: str = "val_loss",
        save_best_only: bool = False,
        save_weights_only: bool = False,
        mode: Mode = "auto",
        verbose: bool = True,
    ) -> None:
        owner = "ModelCheckpoint"
        if not isinstance(filepath, str):
            filepath = str(filepath) if isinstance(filepath, Path) else filepath
        self.filepath = _check_str(owner, "filepath", filepath)
        self.monitor = _check_str(owner, "monitor", monitor)
        self.save_best_only = _check_bool(owner, "save_best_only", save_best_only)
        self.save_weights_only = _check_bool(owner, "save_weights_only", save_weights_only)
        self.mode: Mode = _check_mode(owner, mode)
        self.verbose = _check_bool(owner, "verbose", verbose)
        self._fields = _template_fields(owner, self.filepath)
        sample = {name: 0.5 for name in self._fields}
        sample["epoch"] = 1
        try:
            self.filepath.format(**sample)
        except (ValueError, TypeError) as exc:
            raise CallbackError(
                f"{_where(owner, 'filepath')}: {self.filepath!r} cannot be formatted ({exc}); "
                "epoch is an integer ({epoch:02d}) and metrics are floats ({val_loss:.4f})"
            ) from None
        self._reset()

    def _reset(self) -> None:
        self._reset_monitor()
        self.best: float | None = None
        self.last_saved: str | None = None

    def on_train_begin(self, logs: dict[str, float] | None = None) -> None:
        self._reset()
        if self._run().save_model is None:
            raise CallbackError(
                "ModelCheckpoint needs the engine's save_model, which this run does not provide"
            )

    def format_path(self, epoch: int, logs: dict[str, float] | None) -> str:
        """The path for this epoch: the template filled with ``epoch`` and the epoch logs."""
        values: dict[str, Any] = dict(logs or {})
        values["epoch"] = epoch
        missing = [name for name in self._fields if name not in values]
        if missing:
            raise CallbackError(
                f"ModelCheckpoint(filepath={self.filepath!r}) names {missing}, which the epoch "
                f"logs do not have (available: {', '.join(sorted(values))}): use those names"
            )
        return self.filepath.format(**values)

    def on_epoch_end(self, epoch: int, logs: dict[str, float] | None = None) -> None:
        previous = self.best
        if self.save_best_only:
            current = self._current(logs)
            if current is None:
                return
            if not self._improved(current, self.best, 0.0):
                if self.verbose:
                    best = "none" if self.best is None else f"{self.best:.6g}"
                    print(f"Epoch {epoch}: {self.monitor} did not improve from {best}", flush=True)
                return
            self.best = current
        run = self._run()
        path = self.format_path(epoch, logs)
        target = Path(run.resolve_path(path))
        if run.is_main:
            target.parent.mkdir(parents=True, exist_ok=True)
        run.save_model(target, self.save_weights_only)  # every rank: it may run collectives
        self.last_saved = str(target)
        if self.verbose:
            what = "weights" if self.save_weights_only else "checkpoint"
            if self.save_best_only:
                before = "none" if previous is None else f"{previous:.6g}"
                print(
                    f"Epoch {epoch}: {self.monitor} improved from {before} to {self.best:.6g}, "
                    f"saving {what} to {path}",
                    flush=True,
                )
            else:
                print(f"Epoch {epoch}: saving {what} to {path}", flush=True)


# -- ReduceLROnPlateau --------------------------------------------------------------------------


class ReduceLROnPlateau(_MonitorCallback):
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
        self.monitor = _check_str(owner, "monitor", monitor)
        self.factor = _check_float(owner, "factor", factor, 0.0)
        if not 0.0 < self.factor < 1.0:
            raise CallbackError(
                f"{_where(owner, 'factor')}: expected a number in (0, 1) that multiplies the "
                f"learning rate, got {factor!r}"
            )
        self.patience = _check_int(owner, "patience", patience, 0)
        self.min_lr = _check_float(owner, "min_lr", min_lr, 0.0)
        self.mode: Mode = _check_mode(owner, mode)
        self.min_delta = _check_float(owner, "min_delta", min_delta, 0.0)
        self.cooldown = _check_int(owner, "cooldown", cooldown, 0)
        self.verbose = _check_bool(owner, "verbose", verbose)
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


# -- registry -----------------------------------------------------------------------------------

BUILTIN_CALLBACKS: dict[str, type[Callback]] = {
    "EarlyStopping": EarlyStopping,
    "ModelCheckpoint": ModelCheckpoint,
    "ReduceLROnPlateau": ReduceLROnPlateau,
}


def init_params(callback: Callback) -> dict[str, Any]:
    """A built-in callback's init arguments (each stored under its own name)."""
    signature = inspect.signature(type(callback).__init__)
    return {
        name: getattr(callback, name)
        for name, parameter in signature.parameters.items()
        if name != "self" and parameter.kind is parameter.POSITIONAL_OR_KEYWORD
    }
