"""What a strategy reads of the loop's parts (:class:`ace3.runtime.components.Components` is
one): the checkpoint formats' view (:class:`ace3.runtime.checkpoint.format.TrainingParts`:
module, optimizer, precision, scaler, schedule, position) plus the user's code and the loss the
step computes. A Protocol, so ``parallel/`` does not import the components that hold its
strategy (no import cycle between them)."""

from __future__ import annotations

from typing import Protocol

from ace3.runtime.checkpoint.format import TrainingParts
from ace3.runtime.loop.losses import TrainingLoss
from ace3.runtime.user_code import UserCode


class StepParts(TrainingParts, Protocol):
    """The parts a strategy's step, validation and end read."""

    @property
    def user(self) -> UserCode: ...
    @property
    def training_loss(self) -> TrainingLoss: ...
