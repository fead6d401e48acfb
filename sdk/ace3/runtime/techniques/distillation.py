"""Knowledge distillation, a technique like the others: the loss the strategy's step is given
(:meth:`Distiller.forward_loss` as ``Components.training_loss``, in place of
:func:`ace3.runtime.loop.losses.forward_loss`) and a loop extension
(:class:`ace3.runtime.loop.extensions.LoopExtension`): the projections' optimizer step
(``before_forward``, ``after_optimizer_step``), the ``kd_loss`` / ``feature_loss`` /
``task_loss`` (/ ``attention_loss``) metrics (``training_metrics``, beside ``train_loss``,
averaged the same way) and the feature hooks' removal (``close``).

The loss: ``alpha * T^2 * KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * task_loss +
feature_loss_weight * feature_loss + attention_loss_weight * attention_loss``. The teacher
(:mod:`ace3.runtime.techniques.teacher`) runs under ``torch.no_grad()`` inside the step's autocast, on
the batch's inputs (``teacher(inputs)`` for ``(inputs, targets)`` batches, ``teacher(**batch)``
for dict batches). Feature pairs are read by forward hooks on the named student and teacher
modules (their output, the first tensor of a tuple; the last dimension is the width). When the
widths differ, a linear projection (student width -> teacher width) learns with the student:
initialised from the job's seed (the same on every rank), its gradients averaged over the
ranks, stepped by an optimizer of the config's kind at the student's learning rate. The
projections are not part of the model's checkpoints (a resumed run starts them again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ace3.config import TrainingConfig
from ace3.config.distillation import DistillationConfig
from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.loop.losses import ForwardResult, batch_size_of, default_loss
from ace3.runtime.loop.optim import build_optimizer
from ace3.runtime.loop.precision import Precision, cast_floating
from ace3.runtime.parallel.base import average_over
from ace3.runtime.process.distributed import DistContext
from ace3.runtime.techniques.distillation_losses import (
    attention_loss,
    attentions_of,
    hidden_state_loss,
    kd_loss,
    logits_of,
)
from ace3.runtime.user_code import LossFn

PARTS = ("kd_loss", "feature_loss", "task_loss", "attention_loss")


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    hidden = getattr(output, "last_hidden_state", None)
    return hidden if isinstance(hidden, torch.Tensor) else None


def _module(model: nn.Module, name: str, who: str) -> nn.Module:
    modules = dict(model.named_modules())
    if name not in modules:
        shown = ", ".join(n for n in list(modules)[1:20] if n)
        raise ValueError(
            f"distillation.feature_layers: the {who} has no module {name!r} (its modules: "
            f"{shown}{', ...' if len(modules) > 20 else ''})"
        )
    return modules[name]


class Distiller(LoopExtension):
    """The distillation state of one rank: teacher, hooks, projections, metric sums."""

    def __init__(
        self,
        config: TrainingConfig,
        student: nn.Module,
        teacher: nn.Module,
        precision: Precision,
        ctx: DistContext,
    ) -> None:
        assert config.distillation is not None
        self.config, self.settings = config, config.distillation
        self.teacher, self.precision, self.ctx = teacher, precision, ctx
        self.features: dict[str, torch.Tensor | None] = {}
        self.pairs = list(self.settings.feature_layers.items())
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        for index, (s_name, t_name) in enumerate(self.pairs):
            for model, name, key in ((student, s_name, "s"), (teacher, t_name, "t")):
                module = _module(model, name, "student" if key == "s" else "teacher")
                self.handles.append(module.register_forward_hook(self._keep(f"{key}{index}")))
        self.projections: dict[int, nn.Linear] = {}
        self.optimizer: torch.optim.Optimizer | None = None
        self.step_sums = torch.zeros(len(PARTS), dtype=torch.float64, device=ctx.device)
        self.step_samples = 0
        self.window = torch.zeros(len(PARTS), dtype=torch.float64, device=ctx.device)
        self.window_steps = 0

    def describe(self) -> str:
        """What rank 0 logs at build time."""
        s = self.settings
        params = sum(p.numel() for p in self.teacher.parameters())
        origin = getattr(self.teacher, "ace3_weights_origin", None)
        weights = f"weights from {origin}" if origin else "its own weights"
        parts = [f"T={s.temperature:g}", f"alpha={s.alpha:g}"]
        if self.pairs:
            parts.append(
                f"{len(self.pairs)} feature pair(s) ({s.hidden_loss}, {s.feature_weight:g})"
            )
        if s.attention_loss_weight:
            parts.append(f"attention maps ({s.attention_loss_weight:g})")
        return (
            f"distillation: teacher {type(self.teacher).__name__} ({params:,} parameters, "
            f"{weights}), {', '.join(parts)}"
        )

    def _keep(self, key: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self.features[key] = _first_tensor(output)

        return hook

    # -- the loss of one micro-batch -----------------------------------------------------------
    def forward_loss(self, model: nn.Module, batch: Any, user_loss: LossFn | None) -> ForwardResult:
        """Student and teacher forward passes and the distillation loss (see the module
        docstring); call it where :func:`ace3.runtime.loop.losses.forward_loss` would be."""
        settings = self.settings
        self.features.clear()
        student_out, task, targets = self._student(model, batch, user_loss)
        teacher_out = self._teacher(batch)
        s_logits = logits_of(student_out, "student")
        kd = kd_loss(s_logits, logits_of(teacher_out, "teacher"), settings.temperature)
        total = settings.alpha * kd + (1.0 - settings.alpha) * task
        values = [kd.detach(), torch.zeros_like(kd), task.detach(), torch.zeros_like(kd)]
        if self.pairs:
            feature = self._feature_loss()
            total = total + settings.feature_weight * feature
            values[1] = feature.detach()
        if settings.attention_loss_weight > 0:
            attention = attention_loss(
                attentions_of(student_out, "student"), attentions_of(teacher_out, "teacher")
            )
            total = total + settings.attention_loss_weight * attention
            values[3] = attention.detach()
        samples = batch_size_of(batch)
        self.step_sums += torch.stack(values).to(torch.float64) * samples
        self.step_samples += samples
        logits = s_logits if isinstance(student_out, torch.Tensor) else None
        return ForwardResult(total.reshape(()), logits, targets)

    def _student(
        self, model: nn.Module, batch: Any, user_loss: LossFn | None
    ) -> tuple[Any, torch.Tensor, Any]:
        """(the student's output, the task loss, the targets if known)."""
        pair = isinstance(batch, (list, tuple)) and len(batch) == 2
        if user_loss is not None:
            returned = user_loss(model, batch)
            if not (isinstance(returned, tuple) and len(returned) == 2):
                raise ValueError(
                    "distillation needs the student's logits: compute_loss(model, batch) must "
                    "return (loss, outputs) when distillation is set"
                )
            loss, outputs = returned
            return outputs, loss.reshape(()), batch[1] if pair else None
        if isinstance(batch, Mapping):
            outputs = model(**batch)
            loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs.loss
            if not isinstance(loss, torch.Tensor):
                raise ValueError("a dict batch's model output must carry a .loss (the task loss)")
            return outputs, loss.reshape(()), None
        if not pair:
            raise ValueError(
                "distillation runs the teacher on the batch's inputs: batches must be "
                "(inputs, targets) pairs or dicts of model keyword arguments"
            )
        inputs, targets = batch
        outputs = model(inputs)
        attached = outputs.get("loss") if isinstance(outputs, Mapping) else None
        attached = attached if attached is not None else getattr(outputs, "loss", None)
        if isinstance(attached, torch.Tensor):
            return outputs, attached.reshape(()), targets
        return outputs, default_loss(logits_of(outputs, "student"), targets), targets

    @torch.no_grad()
    def _teacher(self, batch: Any) -> Any:
        if self.precision.casts_model:  # O2/O3: the teacher's weights are 16-bit too
            batch = cast_floating(batch, self.precision.model_dtype)
        if isinstance(batch, Mapping):
            return self.teacher(**batch)
        if isinstance(batch, (list, tuple)) and len(batch) == 2:
            return self.teacher(batch[0])
        raise ValueError("distillation needs (inputs, targets) or dict batches for the teacher")

    def _feature_loss(self) -> torch.Tensor:
        total = None
        for index, (s_name, t_name) in enumerate(self.pairs):
            s, t = self.features.get(f"s{index}"), self.features.get(f"t{index}")
            if s is None or t is None:
                which = s_name if s is None else t_name
                raise ValueError(
                    f"distillation.feature_layers: module {which!r} did not run in the forward "
                    "pass or its output is not a tensor (or a tuple starting with one)"
                )
            if s.shape[:-1] != t.shape[:-1]:
                raise ValueError(
                    f"distillation.feature_layers {s_name!r} -> {t_name!r}: outputs "
                    f"{tuple(s.shape)} and {tuple(t.shape)} differ before the last (width) "
                    "dimension"
                )
            if s.shape[-1] != t.shape[-1]:
                s = self._projection(index, s.shape[-1], t.shape[-1])(s.float())
            term = hidden_state_loss(s, t, self.settings.hidden_loss)
            total = term if total is None else total + term
        assert total is not None
        return total / len(self.pairs)

    def _projection(self, index: int, width: int, target: int) -> nn.Linear:
        if index not in self.projections:
            generator = torch.Generator().manual_seed(self.config.seed + 7919 * (index + 1))
            layer = nn.Linear(width, target)
            with torch.no_grad():
                bound = 1.0 / width**0.5
                layer.weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)
            self.projections[index] = layer.to(self.ctx.device)
            params = [p for proj in self.projections.values() for p in proj.parameters()]
            self.optimizer = build_optimizer(params, self.config)
        return self.projections[index]

    # -- around the optimizer step -------------------------------------------------------------
    def before_forward(self) -> None:
        """Before a step's (or a retried step's) first micro-batch."""
        self.step_sums.zero_()
        self.step_samples = 0
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    def after_optimizer_step(self, loss_scale: float, skipped: bool, learning_rate: float) -> None:
        """After the student's optimizer step: the projections' step (gradients averaged over
        the ranks and unscaled; skipped with the student's), and the step's loss parts."""
        if self.step_samples:
            self.window += self.step_sums / self.step_samples
            self.window_steps += 1
        if self.optimizer is None:
            return
        grads = [
            p.grad
            for proj in self.projections.values()
            for p in proj.parameters()
            if p.grad is not None
        ]
        if self.ctx.world_size > 1 and grads:
            average_over(grads, self.ctx.world_size)
        if not skipped:
            if loss_scale != 1.0:
                for grad in grads:
                    grad.div_(loss_scale)
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Remove the feature hooks (an in-process student is the caller's module)."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.features.clear()

    # -- metrics -------------------------------------------------------------------------------
    def training_metrics(self) -> dict[str, float]:
        """The loss parts' means since the last report, over the steps and the ranks (a
        collective: every rank calls it where it reports ``train_loss``)."""
        vector = torch.cat(
            [self.window, torch.tensor([float(self.window_steps)], device=self.ctx.device)]
        ).to(torch.float64)
        if self.ctx.world_size > 1:
            dist.all_reduce(vector)
        self.window.zero_()
        self.window_steps = 0
        steps = float(vector[-1].item())
        if steps == 0:
            return {}
        means = (vector[:-1] / steps).tolist()
        wanted = {"kd_loss", "feature_loss", "task_loss"}
        if self.settings.attention_loss_weight > 0:
            wanted.add("attention_loss")
        return {name: value for name, value in zip(PARTS, means, strict=True) if name in wanted}


def make_distiller(
    settings: DistillationConfig | None,
    config: TrainingConfig,
    student: nn.Module,
    teacher: nn.Module | None,
    precision: Precision,
    ctx: DistContext,
) -> Distiller | None:
    """The run's distiller (None without ``config.distillation``)."""
    if settings is None:
        return None
    if teacher is None:
        raise ValueError("distillation is set but no teacher was built for this run")
    return Distiller(config, student, teacher, precision, ctx)
