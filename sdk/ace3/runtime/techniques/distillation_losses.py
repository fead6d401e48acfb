"""The distillation loss terms, as plain functions of tensors (all computed in float32).

- :func:`kd_loss`: ``T^2 * KL(softmax(t/T) || softmax(s/T))``, averaged over the samples (and
  positions, for ``[batch, ..., classes]`` logits);
- :func:`hidden_state_loss`: MSE or ``1 - cosine similarity`` over the last dimension;
- :func:`attention_loss`: MSE between head-averaged attention maps, the student's layers
  spread evenly over the teacher's.

A model's output gives its logits as a tensor, ``.logits`` or ``['logits']``, and its attention
maps (a sequence of ``[batch, heads, queries, keys]`` tensors) as ``.attentions`` or
``['attentions']``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F


def _field(output: Any, name: str) -> Any:
    if isinstance(output, Mapping):
        return output.get(name)
    return getattr(output, name, None)


def logits_of(output: Any, who: str) -> torch.Tensor:
    """The class logits of a model output (see the module docstring)."""
    logits = output if isinstance(output, torch.Tensor) else _field(output, "logits")
    if not isinstance(logits, torch.Tensor):
        raise ValueError(
            f"distillation needs the {who}'s logits: its output is {type(output).__name__}, "
            "neither a tensor nor an output with .logits"
        )
    if logits.ndim < 2 or logits.shape[-1] < 2:
        raise ValueError(
            f"distillation needs class logits [batch, ..., classes]; the {who} gave shape "
            f"{tuple(logits.shape)}"
        )
    return logits


def attentions_of(output: Any, who: str) -> Sequence[torch.Tensor]:
    """The attention maps of a model output; refused when the model exposes none."""
    maps = _field(output, "attentions") if not isinstance(output, torch.Tensor) else None
    if not maps or not all(isinstance(m, torch.Tensor) and m.ndim == 4 for m in maps):
        raise ValueError(
            f"attention_loss_weight > 0 needs the {who}'s attention maps: its output must have "
            ".attentions (or ['attentions']), a sequence of [batch, heads, queries, keys] "
            f"tensors (e.g. output_attentions=True); it is {type(output).__name__}. Set "
            "attention_loss_weight=0 for this model"
        )
    return list(maps)


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T^2 * KL(teacher || student)`` of the softened distributions, a scalar."""
    if student.shape != teacher.shape:
        raise ValueError(
            f"student logits {tuple(student.shape)} and teacher logits {tuple(teacher.shape)} "
            "differ: distillation needs the same classes (and positions) from both"
        )
    classes = student.shape[-1]
    s = F.log_softmax(student.float().reshape(-1, classes) / temperature, dim=-1)
    t = F.log_softmax(teacher.float().reshape(-1, classes) / temperature, dim=-1)
    kl = F.kl_div(s, t, log_target=True, reduction="batchmean")
    return kl * (temperature * temperature)


def hidden_state_loss(student: torch.Tensor, teacher: torch.Tensor, kind: str) -> torch.Tensor:
    """MSE or ``1 - cosine`` (over the last dimension) of same-shaped hidden states."""
    student, teacher = student.float(), teacher.float()
    if kind == "cosine":
        return (1.0 - F.cosine_similarity(student, teacher, dim=-1)).mean()
    return F.mse_loss(student, teacher)


def attention_loss(
    student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor]
) -> torch.Tensor:
    """MSE of head-averaged maps; student layer i pairs with the teacher layer at the same
    relative depth."""
    total = None
    last_s, last_t = len(student) - 1, len(teacher) - 1
    for i, s_map in enumerate(student):
        j = round(i * last_t / last_s) if last_s else last_t
        s, t = s_map.float().mean(dim=1), teacher[j].float().mean(dim=1)
        if s.shape != t.shape:
            raise ValueError(
                f"student attention map {i} {tuple(s.shape)} and teacher map {j} "
                f"{tuple(t.shape)} differ (batch, queries, keys must match)"
            )
        term = F.mse_loss(s, t)
        total = term if total is None else total + term
    assert total is not None
    return total / len(student)
