"""The instability guard (``TrainingConfig.instability``, :class:`ace3.InstabilityConfig`).

Detection runs in the step runner (:class:`ace3.runtime.loop.steps.StepRunner`) between the backward
pass and the optimizer step, on every rank: :meth:`InstabilityGuard.check` all-reduces the
step's loss and gradient norm (one small all-reduce and one host read per step: the guard's
whole per-step cost, measured by ``benchmarks/overhead.py``) and decides from the reduced
values, so every rank decides the same. An unstable step's update is dropped unless the action
is ``warn``. The loop then calls :func:`react` (every rank, right after the step): rank 0 writes
the ``instability`` record, and the action runs: ``rollback`` finds the newest checkpoint of
the run's checkpoint directory and the loop rolls back to it
(:meth:`ace3.runtime.loop.view.LoopView.roll_back_to`, which loads it with
:func:`rolled_back_state`), ``stop`` raises :class:`ace3.errors.InstabilityError`. The loop
then runs every extension's ``on_instability`` (every action but ``stop``).

With the guard off nothing here runs: a NaN loss still stops the run at the next metrics
report (:class:`ace3.errors.NonFiniteLossError`), as before.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ace3.config.checkpoint_names import CHECKPOINT_NAME_RE
from ace3.config.instability import InstabilityConfig
from ace3.errors import InstabilityError, UnsupportedFeatureError
from ace3.runtime.checkpoint.files import load_checkpoint
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.loop.view import LoopView
from ace3.runtime.process.distributed import DistContext

if TYPE_CHECKING:
    from ace3.runtime.components import Components


@dataclass(frozen=True)
class Finding:
    """An unstable optimizer step (``step`` counts from 1) and what was found (reduced over
    every rank: the same on all)."""

    step: int
    reason: str
    loss: float
    grad_norm: float | None


def _number(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else str(value)


class InstabilityGuard:
    """Decides, per optimizer step, whether it is unstable (see :class:`InstabilityConfig`)."""

    def __init__(self, config: InstabilityConfig, ctx: DistContext) -> None:
        self.config, self.ctx = config, ctx
        self.recent: deque[float] = deque(maxlen=config.window)  # accepted steps' losses
        self.finding: Finding | None = None  # the last step's, until :func:`react` takes it

    @property
    def drops_update(self) -> bool:
        return self.config.action != "warn"

    def check(
        self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor | None, scaled: bool
    ) -> Finding | None:
        """Step ``step``'s (from 1) verdict, kept in :attr:`finding`. ``loss``: this rank's
        mean step loss; ``grad_norm``: the global norm (None: not taken); ``scaled``: a loss
        scaler runs (it handles non-finite gradients itself). A collective and a host read."""
        parts = [loss.detach().reshape(()).to(torch.float64)]
        if grad_norm is not None:
            parts.append(grad_norm.detach().reshape(()).to(device=loss.device, dtype=torch.float64))
        vector = torch.stack(parts)
        world = self.ctx.world_size
        if world > 1:
            dist.all_reduce(vector)  # the norm is the same on every rank: its mean is itself
        values = [value / world for value in vector.tolist()]
        mean_loss = values[0]
        norm = values[1] if grad_norm is not None else None
        reason = self._reason(mean_loss, norm, scaled)
        if reason is None:
            self.recent.append(mean_loss)
            self.finding = None
        else:
            self.finding = Finding(step, reason, mean_loss, norm)
        return self.finding

    def _reason(self, loss: float, norm: float | None, scaled: bool) -> str | None:
        config = self.config
        if not math.isfinite(loss):
            return f"loss {_number(loss)}"
        if norm is not None and not math.isfinite(norm) and not scaled:
            return f"grad_norm {_number(norm)}"
        spike = config.max_grad_norm_spike
        # (an infinite norm under a loss scaler is its overflow: the scaler skips that step and
        # lowers its scale; judged a spike, the scale would never back off)
        if norm is not None and spike is not None and math.isfinite(norm) and norm > spike:
            return f"grad_norm {_number(norm)} > max_grad_norm_spike {spike:g}"
        if self.recent:
            low = min(self.recent)
            if low > 0 and loss > config.explosion_factor * low:
                return (
                    f"loss {_number(loss)} > {config.explosion_factor:g} x recent minimum "
                    f"{_number(low)} (last {len(self.recent)} steps)"
                )
        return None


# The lowest learning-rate factor rollbacks reach (lr_factor ** max_rollbacks could underflow).
MIN_LR_SCALE = 1e-12


def make_guard(config: InstabilityConfig | None, ctx: DistContext) -> InstabilityGuard | None:
    return InstabilityGuard(config, ctx) if config is not None else None


@dataclass(frozen=True)
class Reaction:
    """What :func:`react` did about an unstable step: ``rolled_back`` (the loop then trains on
    from the restored position)."""

    reason: str
    rolled_back: bool


def check_rollback_place(guard: InstabilityGuard | None, checkpoint_dir: Path | None) -> None:
    """A rollback needs the run's checkpoint files (an in-process run without ``save_dir`` has
    none): refused before the first step."""
    if guard is not None and guard.config.action == "rollback" and checkpoint_dir is None:
        raise UnsupportedFeatureError(
            "instability.action='rollback' reloads the run's checkpoints, and this run writes "
            "none: give the Trainer a save_dir, or use action='skip'"
        )


def react(loop: LoopView, guard: InstabilityGuard | None) -> Reaction | None:
    """After each step (every rank): None when the guard found it stable; otherwise record it
    and act (the loop performs a rollback: :meth:`LoopView.roll_back_to`)."""
    if guard is None or guard.finding is None:
        return None
    finding, guard.finding = guard.finding, None
    state, config = loop.state, guard.config
    action, note = config.action, ""
    target: Path | None = None
    if action == "rollback":
        if state.rollbacks >= config.max_rollbacks:
            note = f"{state.rollbacks} rollback(s) already, max_rollbacks={config.max_rollbacks}"
        else:
            target = _newest_checkpoint(loop, finding.step)
            if target is None:
                note = "no checkpoint of this run to roll back to yet (see save_interval)"
        if target is None:
            action = "stop"
    rolled_to = _checkpoint_step(target) if target is not None else None
    lr_scale = state.lr_scale * (config.lr_factor if target is not None else 1.0)
    lr_scale = max(lr_scale, MIN_LR_SCALE)  # (never 0: every rank must take the same path)
    loop.events.instability(
        finding.step, state.display_epoch(), action, finding.reason + (f" ({note})" if note else ""),
        finding.loss, finding.grad_norm, lr_scale, rolled_to,
    )  # fmt: skip
    if action == "stop":
        error = InstabilityError(finding.step, finding.reason, config.action, note)
        loop.log(f"stopping at step {finding.step}: {error}")
        raise error
    done = {"warn": "step applied", "skip": "step skipped"}.get(
        action, f"rolled back to step {rolled_to}, learning rate x{lr_scale:g}"
    )
    loop.log(f"step {finding.step}: training instability: {finding.reason}; {done}")
    if target is not None:
        loop.roll_back_to(target, lr_scale)
        guard.recent.clear()
    return Reaction(finding.reason, rolled_back=target is not None)


def _checkpoint_step(path: Path) -> int:
    match = CHECKPOINT_NAME_RE.match(path.name)
    assert match is not None
    return int(match.group(1))


def _newest_checkpoint(loop: LoopView, before_step: int) -> Path | None:
    """The run's newest checkpoint before ``before_step``, as rank 0 sees its directory
    (broadcast, so every rank loads the same file)."""
    loop.finish_saves()  # an async_save in flight is written (and recorded) first
    found: list[str | None] = [None]
    directory = loop.place.checkpoint_dir
    if loop.ctx.is_main and directory is not None and directory.is_dir():
        steps = [
            (int(m.group(1)), path)
            for path in directory.iterdir()
            if (m := CHECKPOINT_NAME_RE.match(path.name)) and int(m.group(1)) < before_step
        ]
        found = [str(max(steps)[1]) if steps else None]
    if loop.ctx.world_size > 1:
        dist.broadcast_object_list(found, src=0)
    return Path(found[0]) if found[0] is not None else None


def rolled_back_state(parts: Components, path: Path, lr_scale: float) -> TrainState:
    """Load ``path`` into the run's model and optimizer (every rank: the strategy's resume, a
    collective); return the position to go on from, its learning rate times ``lr_scale`` and
    one more rollback counted (kept in the train state, so the next checkpoints carry them)."""
    rollbacks = parts.state.rollbacks + 1
    parts.precision.zero_grad(parts.optimizer)
    restored = parts.strategy.checkpoints.restore(load_checkpoint(path), parts)
    restored.lr_scale, restored.rollbacks = lr_scale, rollbacks
    return restored
