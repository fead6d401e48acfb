"""The callback base class (:class:`Callback`, every hook a no-op) and :class:`CallbackError`."""

from __future__ import annotations

from typing import Any, Literal

from ace3.errors import ACE3Error

__all__ = ["Callback", "CallbackError", "Mode"]


Mode = Literal["auto", "min", "max"]


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
