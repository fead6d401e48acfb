"""A small fake of the training loop's view (:class:`ace3.runtime.loop.view.LoopView`) for unit
tests of what the loop drives (extensions, the saver's tracker): the figures it shows, and its
operations recorded (``logged``, ``reported``, ``saved_at``, ``rolled_back``; kept entries go to
``state.carry``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ace3.config import TrainingConfig
from ace3.runtime.loop.hooks import HookList
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.loop.view import LoopParts, LoopView, RunPlace
from ace3.runtime.observe.reporting import EventWriter
from ace3.runtime.process.distributed import DistContext


class FakeLoop:
    """A one-rank loop view over ``state`` (nothing trains: the test moves ``state``)."""

    def __init__(
        self,
        state: TrainState,
        config: TrainingConfig | None = None,
        tmp_dir: Path = Path("/nonexistent"),
        split: int = 1,
        batches_per_epoch: int = 100,
        validate: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.config = config or TrainingConfig()
        self.ctx = DistContext(0, 0, 1, "gloo", torch.device("cpu"))
        self.place = RunPlace("test run", tmp_dir, None)
        self.state = state
        self.events = EventWriter(tmp_dir / "events.jsonl", enabled=False)
        self.hooks = HookList()
        self.train_data: Any = None
        self.val_loader: Any = None
        self.batches_per_epoch = batches_per_epoch
        self.micro_batch_split = split
        self.last_step_skipped = False
        self.last_saved_step: int | None = None
        self._validate = validate or dict
        self.logged: list[str] = []
        self.reported: list[dict[str, float]] = []
        self.saved_at: list[int] = []
        self.rolled_back: list[tuple[Path, float]] = []

    @property
    def parts(self) -> LoopParts:
        raise AssertionError("this fake has no model or data")

    def log(self, message: str) -> None:
        self.logged.append(message)

    def done(self) -> bool:
        return self.config.max_steps is not None and self.state.step >= self.config.max_steps

    def checkpoint_name(self, step: int) -> str:
        return f"step-{step:08d}.pt"

    def report_metrics(self, values: dict[str, float]) -> None:
        self.reported.append(dict(values))
        self.state.record(values)

    def evaluate_model(self) -> dict[str, float]:
        return self._validate()

    def validation_at_step(self) -> dict[str, float]:
        values = self.evaluate_model()
        if values:
            self.report_metrics(values)
        return values

    def saving(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def keep_in_checkpoint(self, key: str, value: list[float]) -> None:
        self.state.carry[key] = value

    def save_checkpoint_now(self) -> None:
        if self.last_saved_step != self.state.step:
            self.saved_at.append(self.state.step)
            self.last_saved_step = self.state.step

    def finish_saves(self) -> None:
        return None

    def roll_back_to(self, path: Path, lr_scale: float) -> None:
        self.rolled_back.append((path, lr_scale))


def as_view(loop: FakeLoop) -> LoopView:
    """The fake, typed as what it stands in for (a type checker checks that it conforms)."""
    return loop
