"""Pruning while training (``TrainingConfig.pruning``): L1 unstructured magnitude pruning of the
Linear and Conv weights with ``torch.nn.utils.prune``, on a schedule.

The schedule (:func:`scheduled_sparsity`) raises the sparsity from ``initial_sparsity`` at
``begin_step`` to ``target_sparsity`` at ``end_step`` (the run's last step by default): cubic is
Zhu & Gupta's ``s_t = s_f + (s_i - s_f) (1 - (t - t0) / (n Δt))^3``, linear even steps, oneshot
the whole target at ``begin_step``. A pruning step runs after optimizer step ``t`` when
``t - begin_step`` is a multiple of ``frequency``, and at ``end_step``: it prunes the smallest
remaining weights until exactly ``round(s_t * N)`` of the ``N`` weights are pruned (``global``:
one threshold over every pruned tensor, ``prune.global_unstructured``; ``layer``: each tensor on
its own, ``prune.l1_unstructured``). A pruned weight stays pruned. Between pruning steps the
masks are ``torch.nn.utils.prune``'s reparametrization (``weight_orig`` x ``weight_mask``), so
the pruned weights get no gradient.

Every rank holds the same weights (data parallelism, ZeRO 0 or 1: other layouts are refused by
:func:`ace3.config.unsupported_settings`), so every rank computes the same masks; rank 0's are
broadcast all the same, so they cannot differ by a tie.

Checkpoints: around every save the masks are folded into the weights (``weight = weight_orig *
weight_mask``, in place, under the plain name), so every checkpoint holds plain weight names with
the pruned weights at zero; a resumed run re-derives the masks from those zeros. At the end the
masks are folded for good (``prune.remove``): the model and the final checkpoint hold plain
weights.

Accuracy drop: just before the first weight is pruned, the model is validated once (reported as
``dense_val_loss`` / ``dense_val_accuracy``); the summary compares it with the final validation
(``pruning_accuracy_drop`` = dense - final accuracy, ``pruning_loss_increase`` = final - dense
loss). The final model has also trained for longer, so this is the net effect of pruning and of
the training around it, measured on the same validation set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import prune

from ace3.config.compression import PruningConfig
from ace3.runtime.loop.extensions import LoopExtension, matching_modules
from ace3.runtime.loop.view import LoopView
from ace3.runtime.process.distributed import DistContext

PRUNABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def scheduled_sparsity(settings: PruningConfig, step: int, end_step: int) -> float:
    """The sparsity the schedule asks for after optimizer step ``step`` (0 before it begins)."""
    begin, target, initial = (
        settings.begin_step,
        settings.target_sparsity,
        settings.initial_sparsity,
    )
    if step < begin:
        return 0.0
    if settings.schedule == "oneshot" or step >= end_step:
        return target
    progress = (step - begin) / (end_step - begin)
    if settings.schedule == "cubic":
        return target + (initial - target) * (1.0 - progress) ** 3
    return initial + (target - initial) * progress


def is_pruning_step(settings: PruningConfig, step: int, end_step: int) -> bool:
    begin = settings.begin_step
    return begin <= step <= end_step and (
        (step - begin) % settings.frequency == 0 or step == end_step
    )


def _fold(module: nn.Module) -> torch.Tensor:
    """``prune.remove`` without replacing the parameter's storage (the optimizer and DDP keep
    their references): the weight becomes ``weight_orig * weight_mask`` under its plain name.
    Returns the mask."""
    for key, hook in list(module._forward_pre_hooks.items()):
        if isinstance(hook, prune.BasePruningMethod) and hook._tensor_name == "weight":
            del module._forward_pre_hooks[key]
    orig = module._parameters.pop("weight_orig")
    mask = module._buffers.pop("weight_mask")
    delattr(module, "weight")  # the masked copy the hook set as a plain attribute
    assert orig is not None and mask is not None
    with torch.no_grad():
        orig.mul_(mask)
    module.weight = orig
    return mask


class Pruner(LoopExtension):
    """Prunes the matching Linear/Conv weights of this rank's model on the schedule."""

    def __init__(
        self, settings: PruningConfig, model: nn.Module, ctx: DistContext, total_steps: int
    ) -> None:
        self.settings, self.ctx = settings, ctx
        self.targets = matching_modules(
            model, settings.target_modules, PRUNABLE, "pruning.target_modules"
        )
        if settings.schedule == "oneshot":
            self.end_step = settings.begin_step
        else:
            self.end_step = settings.end_step if settings.end_step is not None else total_steps
        last = "begin_step" if settings.schedule == "oneshot" else "end_step"
        if self.end_step > total_steps:
            raise ValueError(
                f"pruning.{last}={self.end_step} is after the run's last step ({total_steps}): "
                f"target_sparsity would never be reached; set {last} <= {total_steps} or train "
                "for longer"
            )
        if self.end_step <= settings.begin_step and settings.schedule != "oneshot":
            raise ValueError(
                f"pruning.begin_step={settings.begin_step} leaves no step to prune in: the run "
                f"has {total_steps} steps; lower begin_step or set end_step"
            )
        self.total = sum(module.weight.numel() for _, module in self.targets)
        self.masked = False  # the modules carry prune's reparametrization

    # -- masks ----------------------------------------------------------------------------------
    def pruned_count(self) -> int:
        if self.masked:
            return int(sum(int((m.weight_mask == 0).sum()) for _, m in self.targets))
        return int(sum(int((m.weight == 0).sum()) for _, m in self.targets))

    def sparsity(self) -> float:
        return self.pruned_count() / self.total

    def _prune_to(self, sparsity: float) -> None:
        params = [(module, "weight") for _, module in self.targets]
        if self.settings.scope == "global":
            extra = round(sparsity * self.total) - self.pruned_count()
            if extra > 0:
                prune.global_unstructured(params, pruning_method=prune.L1Unstructured, amount=extra)
        else:
            for module, _ in params:
                done = int((module.weight_mask == 0).sum()) if self.masked else 0
                extra = round(sparsity * module.weight.numel()) - done
                if extra > 0:
                    prune.l1_unstructured(module, "weight", amount=extra)
        for module, _ in params:  # every target carries a mask from the first pruning on
            if not hasattr(module, "weight_mask"):
                prune.identity(module, "weight")
        self.masked = True
        self._agree()

    def _agree(self) -> None:
        """Rank 0's masks on every rank (they are computed from the same weights already)."""
        if self.ctx.world_size > 1:
            for _, module in self.targets:
                dist.broadcast(module.weight_mask, src=0)

    # -- the loop's points ----------------------------------------------------------------------
    def start(self, loop: LoopView) -> None:
        if loop.place.resumed and "sparsity" in loop.state.last_metrics:
            # A checkpoint written once pruning had begun holds the pruned weights as zeros.
            for _, module in self.targets:
                prune.custom_from_mask(module, "weight", module.weight.detach() != 0)
            self.masked = True
            self._agree()
            loop.log(f"pruning: resumed at sparsity {self.sparsity():.4f}")
        self._maybe_prune(loop)

    def after_step(self, loop: LoopView) -> None:
        self._maybe_prune(loop)

    def _maybe_prune(self, loop: LoopView) -> None:
        step = loop.state.step
        if not is_pruning_step(self.settings, step, self.end_step):
            return
        goal = scheduled_sparsity(self.settings, step, self.end_step)
        if round(goal * self.total) <= (self.pruned_count() if self.masked else 0):
            return
        if not self.masked:  # the dense model, validated once before its first pruning
            dense = loop.evaluate_model()
            if dense:
                loop.report_metrics({f"dense_{name}": value for name, value in dense.items()})
        self._prune_to(goal)
        reached = self.sparsity()
        loop.report_metrics({"sparsity": reached})
        loop.log(f"pruning: step {step} sparsity {reached:.4f} (target {goal:.4f})")

    @contextlib.contextmanager
    def _folded(self) -> Iterator[None]:
        if not self.masked:
            yield
            return
        masks = [_fold(module) for _, module in self.targets]
        try:
            yield
        finally:
            for (_, module), mask in zip(self.targets, masks, strict=True):
                prune.custom_from_mask(module, "weight", mask)

    def saving(self) -> contextlib.AbstractContextManager[Any]:
        return self._folded()

    def finish(self, loop: LoopView) -> dict[str, Any]:
        if self.masked:
            for _, module in self.targets:
                prune.remove(module, "weight")
            self.masked = False
        summary: dict[str, Any] = {
            "sparsity": self.sparsity(),
            "target_sparsity": self.settings.target_sparsity,
            "pruned_weights": self.pruned_count(),
            "prunable_weights": self.total,
        }
        metrics = loop.state.last_metrics
        for name in ("val_loss", "val_accuracy"):
            if f"dense_{name}" in metrics:
                summary[f"dense_{name}"] = metrics[f"dense_{name}"]
        if "dense_val_accuracy" in metrics and "val_accuracy" in metrics:
            summary["pruning_accuracy_drop"] = (
                metrics["dense_val_accuracy"] - metrics["val_accuracy"]
            )
        if "dense_val_loss" in metrics and "val_loss" in metrics:
            summary["pruning_loss_increase"] = metrics["val_loss"] - metrics["dense_val_loss"]
        loop.log(
            f"pruning: final sparsity {summary['sparsity']:.4f} of {self.total} weights in "
            f"{len(self.targets)} layer(s) (target {self.settings.target_sparsity})"
        )
        return summary
