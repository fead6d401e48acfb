"""Running sums of the training loss over a span of optimizer steps, reduced across ranks.

A resumed run can *carry* the globally reduced sums of the span the checkpoint interrupted, so
the reported means match an uninterrupted run. The carry enters the reduction on rank 0 only.

A window can also watch for the span's first non-finite (NaN or infinite) step loss. It does so
on the device (a few element-wise operations per step, never a host read); the flag goes out
with the sums when the window is reduced, so every rank learns of it at the same reduction.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

# Codes of the non-finite values in the key reduced across ranks (the order breaks ties).
NONFINITE_VALUES = ("nan", "inf", "-inf")


@dataclass(frozen=True)
class NonFiniteLoss:
    """The first optimizer step of a span whose loss was not finite, over every rank."""

    step: int
    value: str  # "nan", "inf" or "-inf": the loss at that step (on the rank that saw it)


@dataclass(frozen=True)
class SpanSums:
    """A window's sums over all ranks (carry included)."""

    loss_sum: float
    steps: float
    samples: float
    nonfinite: NonFiniteLoss | None  # None unless the window watches and a loss was not finite


@dataclass(frozen=True)
class SpanMeans:
    """A window's reduction: the mean step loss, the global speed, a non-finite loss if any."""

    loss: float
    samples_per_sec: float | None  # None when no step ran since reset (a carried-over window)
    nonfinite: NonFiniteLoss | None
    steps: float = 1.0  # steps in the span (0: every one was dropped by the instability guard)


def _value_name(loss: float) -> str:
    return "nan" if math.isnan(loss) else ("inf" if loss > 0 else "-inf")


class MetricWindow:
    """Loss sum (kept on the device, no sync per step), step and sample counts, wall time.

    ``watch_nonfinite``: also keep, on the device, the step and value of the span's first
    non-finite loss; :meth:`global_sums` then reports it (agreed across ranks).
    """

    def __init__(self, device: torch.device, rank: int, watch_nonfinite: bool = False) -> None:
        self.device = device
        self.rank = rank
        self.watch_nonfinite = watch_nonfinite
        self.reset()

    def reset(self) -> None:
        self.loss = torch.zeros((), dtype=torch.float64, device=self.device)
        # The span's first non-finite loss: its step (0: none) and its value.
        self.first_nonfinite_step = torch.zeros((), dtype=torch.float64, device=self.device)
        self.first_nonfinite_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self.steps = 0
        self.samples = 0
        self.carry_loss = 0.0
        self.carry_steps = 0.0
        self.started = time.perf_counter()

    def set_carry(self, loss_sum: float, steps: float) -> None:
        """Global sums of earlier steps of this span (the same values on every rank)."""
        self.carry_loss, self.carry_steps = float(loss_sum), float(steps)

    def add(self, loss: torch.Tensor, samples: int, step: int) -> None:
        """Add optimizer step ``step``'s mean loss (a device scalar) and sample count."""
        step_loss = loss.detach().to(torch.float64)
        if self.watch_nonfinite:
            # The running sum stays finite exactly as long as every loss added to it was (NaN
            # and inf absorb whatever is added after, and float64 cannot overflow on finite
            # losses), so ``first`` is true for the span's first non-finite loss only. Device
            # operations only: no host synchronisation.
            first = torch.isfinite(self.loss) & ~torch.isfinite(step_loss)
            self.first_nonfinite_step += first * step
            self.first_nonfinite_loss = torch.where(first, step_loss, self.first_nonfinite_loss)
        self.loss += step_loss
        self.steps += 1
        self.samples += samples

    @property
    def has_data(self) -> bool:
        """Same answer on every rank (safe to gate collectives on)."""
        return self.steps > 0 or self.carry_steps > 0

    def global_sums(self, world_size: int) -> SpanSums:
        """The span's sums over all ranks, carry included, and its first non-finite loss (when
        watched). A collective; a second, small one only when some rank saw a non-finite loss."""
        carry = self.rank == 0
        values = [
            self.loss + (self.carry_loss if carry else 0.0),
            torch.tensor(
                self.steps + (self.carry_steps if carry else 0.0),
                dtype=torch.float64,
                device=self.device,
            ),
            torch.tensor(float(self.samples), dtype=torch.float64, device=self.device),
            (self.first_nonfinite_step > 0).to(torch.float64),  # ranks that saw one
        ]
        vector = torch.stack(values)
        if world_size > 1:
            dist.all_reduce(vector)
        loss_sum, steps, samples, ranks_with_nonfinite = vector.tolist()
        nonfinite = self._first_nonfinite(world_size) if ranks_with_nonfinite > 0 else None
        return SpanSums(loss_sum, steps, samples, nonfinite)

    def _first_nonfinite(self, world_size: int) -> NonFiniteLoss:
        """The earliest non-finite loss over all ranks (a collective, on the failure path)."""
        step = int(self.first_nonfinite_step.item())
        # One number per rank, the smallest wins: the step first, the kind of value second.
        key = math.inf
        if step > 0:
            value = _value_name(float(self.first_nonfinite_loss.item()))
            key = float(step * len(NONFINITE_VALUES) + NONFINITE_VALUES.index(value))
        reduced = torch.tensor([key], dtype=torch.float64, device=self.device)
        if world_size > 1:
            dist.all_reduce(reduced, op=dist.ReduceOp.MIN)
        first_step, code = divmod(int(reduced.item()), len(NONFINITE_VALUES))
        return NonFiniteLoss(step=first_step, value=NONFINITE_VALUES[code])

    def reduce(self, world_size: int) -> SpanMeans:
        """The mean step loss over the span and the ranks, the global samples/s since reset,
        and the span's first non-finite loss (when watched). A collective."""
        sums = self.global_sums(world_size)
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return SpanMeans(
            loss=sums.loss_sum / max(sums.steps, 1.0),
            samples_per_sec=sums.samples / elapsed if self.steps else None,
            nonfinite=sums.nonfinite,
            steps=sums.steps,
        )
