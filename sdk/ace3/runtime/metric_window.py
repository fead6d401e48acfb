"""Running sums of the training loss over a span of optimizer steps, reduced across ranks.

A resumed run can *carry* the globally reduced sums of the span the checkpoint interrupted, so
the reported means match an uninterrupted run. The carry enters the reduction on rank 0 only.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


class MetricWindow:
    """Loss sum (kept on the device, no sync per step), step and sample counts, wall time."""

    def __init__(self, device: torch.device, rank: int) -> None:
        self.device = device
        self.rank = rank
        self.reset()

    def reset(self) -> None:
        self.loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self.steps = 0
        self.samples = 0
        self.carry_loss = 0.0
        self.carry_steps = 0.0
        self.started = time.perf_counter()

    def set_carry(self, loss_sum: float, steps: float) -> None:
        """Global sums of earlier steps of this span (the same values on every rank)."""
        self.carry_loss, self.carry_steps = float(loss_sum), float(steps)

    def add(self, loss: torch.Tensor, samples: int) -> None:
        self.loss += loss.to(torch.float64)
        self.steps += 1
        self.samples += samples

    @property
    def has_data(self) -> bool:
        """Same answer on every rank (safe to gate collectives on)."""
        return self.steps > 0 or self.carry_steps > 0

    def global_sums(self, world_size: int) -> tuple[float, float, float]:
        """(loss sum, step count, sample count) over all ranks, carry included. A collective."""
        carry = self.rank == 0
        values = [
            self.loss + (self.carry_loss if carry else 0.0),
            torch.tensor(
                self.steps + (self.carry_steps if carry else 0.0),
                dtype=torch.float64,
                device=self.device,
            ),
            torch.tensor(float(self.samples), dtype=torch.float64, device=self.device),
        ]
        vector = torch.stack(values)
        if world_size > 1:
            dist.all_reduce(vector)
        loss_sum, steps, samples = vector.tolist()
        return loss_sum, steps, samples

    def reduce(self, world_size: int) -> tuple[float, float | None]:
        """(mean step loss over the span and the ranks, global samples/s since reset; None when
        no step ran since reset: a window carried over by a resume has no speed)."""
        loss_sum, steps, samples = self.global_sums(world_size)
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return loss_sum / max(steps, 1.0), (samples / elapsed if self.steps else None)
