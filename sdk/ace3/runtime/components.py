"""What the training loop of one rank holds: built by :mod:`ace3.runtime.build`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ace3.config import TrainingConfig
from ace3.runtime.data.train_source import TrainData
from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.loop.losses import TrainingLoss, forward_loss
from ace3.runtime.loop.optim import ScheduleDriver
from ace3.runtime.loop.precision import Precision
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.parallel.base import Strategy
from ace3.runtime.user_code import UserCode

if TYPE_CHECKING:
    from ace3.runtime.loop.batch_growth import BatchGrowth


@dataclass
class Components:
    """What the training loop needs."""

    config: TrainingConfig
    user: UserCode
    # This rank's module, as checkpoints name it: the whole model, its pipeline stage, or the
    # model with sharded (DTensor) parameters.
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: Any  # ace3.amp loss scaler (a pass-through when no scaling is needed)
    precision: Precision
    scheduler: ScheduleDriver | None
    train_set: Dataset[Any]
    validation_set: Dataset[Any] | None
    per_rank_batch: int
    state: TrainState
    strategy: Strategy
    # What the loop reads train_set through: batches per epoch, epochs, the data position.
    train_data: TrainData
    collate_fn: Any = None  # an in-process run may bring its DataLoader's collate_fn
    # Each loader batch runs as this many micro-batches from the first step: what an earlier
    # attempt that ran out of memory left (job.json), 1 otherwise.
    micro_batch_split: int = 1
    # Parts of the engine the loop calls at fixed points (pruning, quantization, ...).
    extensions: list[LoopExtension] = field(default_factory=list)
    # How many loader batches a step takes: batch-size growth (ace3.runtime.loop.batch_growth, also
    # one of the extensions); None: gradient_accumulation_steps.
    batch_plan: BatchGrowth | None = None
    # The loss the strategy's step computes for each training micro-batch: the model's own
    # (ace3.runtime.loop.losses.forward_loss), or knowledge distillation's
    # (ace3.runtime.techniques.distillation.Distiller.forward_loss, one of the extensions too).
    training_loss: TrainingLoss = forward_loss
