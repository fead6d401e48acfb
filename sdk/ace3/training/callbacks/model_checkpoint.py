"""The built-in :class:`ModelCheckpoint`: save the model every epoch, or when a metric improves."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from ace3.training.callbacks.base import CallbackError, Mode
from ace3.training.callbacks.checks import check_bool, check_mode, check_str, where
from ace3.training.callbacks.monitor import MonitorCallback

__all__ = ["ModelCheckpoint"]


def _template_fields(owner: str, filepath: str) -> list[str]:
    """The named fields of a ``str.format`` template; positional or dotted fields are refused."""
    try:
        parsed = list(string.Formatter().parse(filepath))
    except ValueError as exc:
        raise CallbackError(
            f"{where(owner, 'filepath')}: {filepath!r} is not a valid format template ({exc}); "
            "write fields as {epoch:02d} or {val_loss:.2f}, and double literal braces"
        ) from None
    names = []
    for _, field, _, _ in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            raise CallbackError(
                f"{where(owner, 'filepath')}: field {{{field}}} in {filepath!r} must be a plain "
                "name such as {epoch:02d} or {val_loss:.2f} (no positions, dots or indexes)"
            )
        names.append(field)
    return names


class ModelCheckpoint(MonitorCallback):
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
        self.filepath = check_str(owner, "filepath", filepath)
        self.monitor = check_str(owner, "monitor", monitor)
        self.save_best_only = check_bool(owner, "save_best_only", save_best_only)
        self.save_weights_only = check_bool(owner, "save_weights_only", save_weights_only)
        self.mode: Mode = check_mode(owner, mode)
        self.verbose = check_bool(owner, "verbose", verbose)
        self._fields = _template_fields(owner, self.filepath)
        sample = {name: 0.5 for name in self._fields}
        sample["epoch"] = 1
        try:
            self.filepath.format(**sample)
        except (ValueError, TypeError) as exc:
            raise CallbackError(
                f"{where(owner, 'filepath')}: {self.filepath!r} cannot be formatted ({exc}); "
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
