"""Run :class:`ace3.Callback` objects inside the training loop, as one :class:`TrainingHook`.

Callbacks run on every rank with the same arguments (epoch logs are identical across ranks),
so they take the same decisions everywhere: stopping, learning-rate changes, restored weights.
Only rank 0's output is kept: on other ranks, stdout and stderr go to ``os.devnull`` while a
callback runs, so what a callback prints appears once in the job's logs.

Asking to stop: a callback sets ``self.model.stop_training = True``; :meth:`wants_stop` reports
it and the loop agrees across ranks after the epoch (after every step when some callback
overrides a batch method).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

from ace3.runtime.loop.hooks import RunContext, TrainingHook
from ace3.training.callbacks.base import Callback, CallbackError


def _nothing(epoch: int) -> None:
    return None


def overrides(callback: Callback, method: str) -> bool:
    """Whether ``callback`` replaces ``Callback.<method>`` (on its class or the instance)."""
    if method in vars(callback):
        return True
    return getattr(type(callback), method) is not getattr(Callback, method)


class CallbackHook(TrainingHook):
    """Calls each callback's ``on_*`` methods at the loop's hook points."""

    def __init__(self, callbacks: Iterable[Callback]) -> None:
        self.callbacks = list(callbacks)
        for index, callback in enumerate(self.callbacks):
            if not isinstance(callback, Callback):
                raise CallbackError(
                    f"callbacks[{index}] must be an ace3.Callback (or a subclass), not "
                    f"{type(callback).__name__}"
                )
        batch_end = any(overrides(c, "on_batch_end") for c in self.callbacks)
        batch_begin = any(overrides(c, "on_batch_begin") for c in self.callbacks)
        self.checks_stop_every_batch = batch_end or batch_begin
        self.wants_batch_logs = batch_end
        self._devnull: TextIO | None = None

    def bind(self, run: RunContext) -> None:
        self.run = run
        for callback in self.callbacks:
            callback.set_model(run.model)
            callback._ace3_run = run  # type: ignore[attr-defined]  # the built-ins use it

    @contextlib.contextmanager
    def _output(self) -> Iterator[None]:
        if self.run.is_main:
            yield
            return
        if self._devnull is None:
            self._devnull = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
        with contextlib.redirect_stdout(self._devnull), contextlib.redirect_stderr(self._devnull):
            yield

    def _each(self, call: Callable[[Callback], Any]) -> None:
        with self._output():
            for callback in self.callbacks:
                call(callback)

    def on_train_begin(self) -> None:
        self.run.model.stop_training = False
        self._each(lambda c: c.on_train_begin({}))

    def on_epoch_begin(self, epoch: int) -> None:
        self._each(lambda c: c.on_epoch_begin(epoch, {}))

    def on_batch_begin(self, batch: int) -> None:
        self._each(lambda c: c.on_batch_begin(batch, {}))

    def on_batch_end(self, batch: int, logs: dict[str, float]) -> None:
        shared = dict(logs)  # callbacks may add keys for the ones after them, not for the loop
        self._each(lambda c: c.on_batch_end(batch, shared))

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        shared = dict(logs)
        self._each(lambda c: c.on_epoch_end(epoch, shared))
        # Built-ins that act once every callback has seen the epoch (EarlyStopping restores
        # the best weights on the last epoch only after the others saved or logged this one).
        self._each(lambda c: getattr(c, "_ace3_after_epoch_end", _nothing)(epoch))

    def on_train_end(self, logs: dict[str, float]) -> None:
        shared = dict(logs)
        self._each(lambda c: c.on_train_end(shared))

    def wants_stop(self) -> bool:
        return bool(getattr(self.run.model, "stop_training", False))

    def close(self) -> None:
        if self._devnull is not None:
            self._devnull.close()
            self._devnull = None
