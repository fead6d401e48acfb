"""Pipeline-parallel steps and validation on ``torch.distributed.pipelining``.

Each process runs one stage (:mod:`ace3.runtime.parallel.stage_split`) as a ``PipelineStage``; a
``ScheduleGPipe`` or ``Schedule1F1B`` moves activations forward and gradients backward between
neighbouring ranks with point-to-point sends (gloo or nccl).

Batches: every stage of a pipeline reads the same batches (its data-parallel replica's share
of ``batch_size``). Each batch runs as ``n_microbatches`` micro-batches of ``micro_size`` samples;
a shorter batch (the last of an epoch) is padded to the full size with copies of its first
sample whose loss is not counted, so every micro-batch has the shape the stages agreed on at
the first step (a pipeline's receive buffers have fixed shapes).

Loss: the last stage computes the default loss (cross-entropy for integer targets, mean
squared error for float ones, as :mod:`ace3.runtime.loop.losses`) per sample, so that the padded
samples drop out; each micro-batch's loss is its samples' sum divided by the batch's real
sample count and by the batches accumulated in the optimizer step. Summed over micro-batches
and batches this is the mean loss a single process computes on the same samples, and its
gradient is the same mean gradient (``scale_grads=False``: the scale is in the loss). The step's
loss is broadcast from the last stage so every stage (rank 0 writes the metrics) has it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ace3.runtime.loop.losses import (
    batch_size_of,
    count_correct,
    move_to_device,
    shaped_like_float_targets,
)

SCHEDULES = ("gpipe", "1f1b")


def per_sample_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The default loss of each sample (shape ``[N]``): cross-entropy for integer targets,
    mean squared error for float ones (averaged over each sample's other dimensions)."""
    if not isinstance(outputs, torch.Tensor):
        raise TypeError(
            f"the last pipeline stage returned {type(outputs).__name__}; it must return a "
            "tensor of outputs for the default loss"
        )
    if not targets.dtype.is_floating_point:
        losses = F.cross_entropy(outputs.float(), targets.long(), reduction="none")
    else:
        out = shaped_like_float_targets(outputs, targets)
        losses = F.mse_loss(out, targets.float(), reduction="none")
    return losses.reshape(losses.shape[0], -1).mean(dim=1) if losses.ndim > 1 else losses


def inputs_and_targets(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A pipeline batch is ``(inputs, targets)`` with tensor inputs (the first stage's input)."""
    if (
        isinstance(batch, (list, tuple))
        and len(batch) == 2
        and all(isinstance(t, torch.Tensor) for t in batch)
    ):
        return batch[0], batch[1]
    raise ValueError(
        "pipeline parallelism needs (inputs, targets) batches of tensors: the inputs feed the "
        f"first stage and the targets the loss on the last; got {type(batch).__name__}"
    )


def pad_to(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """``tensor`` with copies of its first row appended up to ``size`` rows."""
    missing = size - tensor.shape[0]
    if missing <= 0:
        return tensor
    filler = tensor[:1].expand(missing, *tensor.shape[1:])
    return torch.cat([tensor, filler], dim=0)


class PipelineRunner:
    """This rank's stage and schedule; runs training steps and forward-only passes."""

    def __init__(
        self,
        stage_module: nn.Module,
        stage_index: int,
        num_stages: int,
        n_microbatches: int,
        micro_size: int,
        schedule: str,
        device: torch.device,
        group: Any = None,
    ) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        if schedule not in SCHEDULES:
            raise ValueError(f"pipeline_schedule must be one of {SCHEDULES}, got {schedule!r}")
        self.module = stage_module
        self.index, self.num_stages = stage_index, num_stages
        self.first, self.last = stage_index == 0, stage_index == num_stages - 1
        self.n_microbatches, self.micro_size = n_microbatches, micro_size
        self.device = device
        self.stage = PipelineStage(stage_module, stage_index, num_stages, device, group=group)
        cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
        self.schedule = cls(
            self.stage, n_microbatches=n_microbatches, loss_fn=self._loss, scale_grads=False
        )
        self._targets = torch.empty(0)
        self._real = 0
        self._scale = 1.0
        self._sums = [0.0, 0.0, 0.0, 0.0]  # loss sum, samples, correct, non-classification

    @property
    def batch_capacity(self) -> int:
        return self.n_microbatches * self.micro_size

    def _loss(self, outputs: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The schedule's loss function. Its "target" is the micro-batch's row numbers in the
        padded batch: they pick the real targets and leave out the padding rows."""
        keep = rows < self._real
        targets = self._targets[rows[keep]]
        kept = outputs[keep]
        per_sample = per_sample_loss(kept, targets)
        if not torch.is_grad_enabled() or not outputs.requires_grad:  # forward-only: count
            valid = int(keep.sum().item())
            self._sums[0] += float(per_sample.detach().double().sum().item())
            self._sums[1] += valid
            hits = count_correct(kept, targets) if valid else 0
            if hits is None:
                self._sums[3] += 1
            else:
                self._sums[2] += hits
        return per_sample.sum() * self._scale

    def _prepare(self, batch: Any, scale: float) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(padded inputs, row numbers, real samples); remembers the targets for the loss."""
        inputs, targets = inputs_and_targets(move_to_device(batch, self.device))
        real = batch_size_of(targets)
        if real > self.batch_capacity:
            raise ValueError(
                f"a batch of {real} samples does not fit {self.n_microbatches} micro-batches "
                f"of {self.micro_size}"
            )
        self._targets, self._real = targets, real
        self._scale = scale / max(real, 1)
        size = self.batch_capacity
        rows = torch.arange(size, device=targets.device)
        return pad_to(inputs, size), rows, real

    def _call(self, method: Any, inputs: torch.Tensor, targets: torch.Tensor) -> list[Any]:
        losses: list[Any] = []
        args = (inputs,) if self.first else ()
        kwargs: dict[str, Any] = {"target": targets, "losses": losses} if self.last else {}
        method(*args, **kwargs)
        return losses

    def train_batch(self, batch: Any, weight: float) -> tuple[float, int]:
        """Forward and backward one batch through the pipeline (gradients accumulate, scaled
        by ``weight``). Returns (``weight`` x the batch's mean loss on the last stage, 0.0
        elsewhere; the batch's sample count)."""
        inputs, targets, real = self._prepare(batch, weight)
        losses = self._call(self.schedule.step, inputs, targets)
        return float(sum(float(loss.detach().double().item()) for loss in losses)), real

    @torch.no_grad()
    def eval_batch(self, batch: Any, counted: bool = True) -> None:
        """Forward one batch; the last stage adds its loss and accuracy to the sums (none of
        its samples when not ``counted``: a padding pass)."""
        inputs, targets, _ = self._prepare(batch, 1.0)
        if not counted:
            self._real = 0
        self._call(self.schedule.eval, inputs, targets)

    def reset_sums(self) -> None:
        self._sums = [0.0, 0.0, 0.0, 0.0]

    @property
    def sums(self) -> list[float]:
        return list(self._sums)


def broadcast_from_last(
    values: list[float], src: int, device: torch.device, group: Any = None
) -> list[float]:
    """The last stage's ``values`` (global rank ``src``) on every stage of its pipeline
    (``group``: the pipeline's process group; None: every rank is one stage)."""
    vector = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.broadcast(vector, src=src, group=group)
    return vector.tolist()
