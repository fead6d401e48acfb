"""Forward pass and loss for one batch, following the model contract.

- The user's ``compute_loss(model, batch)`` wins when the model module defines it; it returns
  the loss, or ``(loss, outputs)`` so that class logits still give ``val_accuracy``.
- A dict batch is passed as keyword arguments: ``model(**batch)``; its output must carry a loss.
- An ``(inputs, targets)`` batch: ``outputs = model(inputs)``; an output with a ``.loss``
  attribute (or a dict with ``'loss'``) is used as is; otherwise cross-entropy for integer
  targets and mean squared error for floating targets.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ace3.runtime.user_code import LossFn


@dataclass
class ForwardResult:
    """The batch loss, plus outputs and targets when the default path produced them."""

    loss: torch.Tensor
    outputs: torch.Tensor | None = None
    targets: torch.Tensor | None = None


# The loss of one training micro-batch: (model, batch, the user's compute_loss) -> result; the
# strategy's step runs the one it is given (Components.training_loss: forward_loss, or
# knowledge distillation's).
TrainingLoss = Callable[[nn.Module, Any, LossFn | None], ForwardResult]


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested) tuple/list/dict batch to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {key: move_to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(value, device) for value in batch)
    return batch


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor (1 if none is found)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, Mapping):
        values = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        values = list(batch)
    else:
        return 1
    for value in values:
        if isinstance(value, (torch.Tensor, Mapping, list, tuple)):
            return batch_size_of(value)
    return 1


def _attached_loss(output: Any) -> torch.Tensor | None:
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


def _has_loss_field(output: Any) -> bool:
    """An output that has a loss field, set or not (a ``ModelOutput``'s ``.loss``)."""
    return hasattr(output, "loss") or (isinstance(output, Mapping) and "loss" in output)


def _no_loss_message(batch: Mapping[str, Any], output: Any) -> str:
    """What was passed, what came back, and what is missing, for a dict batch without a loss."""
    fields = ", ".join(repr(str(key)) for key in batch)
    got = (
        f"{type(output).__name__} with loss None"
        if _has_loss_field(output)
        else f"{type(output).__name__} with no .loss (nor a 'loss' key)"
    )
    missing = (
        "; the batch has no 'labels', which a Hugging Face model needs to compute its loss "
        "(name the targets 'labels')"
        if "labels" not in batch
        else ""
    )
    return (
        f"a dict batch is passed as model(**batch), with the fields {fields}, and the model "
        f"returned {got}{missing}; otherwise define compute_loss(model, batch) in the model file"
    )


def _as_scalar(loss: Any, origin: str) -> torch.Tensor:
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"{origin} must return a torch.Tensor loss, got {type(loss).__name__}")
    if loss.numel() != 1:
        raise ValueError(f"{origin} must return a scalar loss, got shape {tuple(loss.shape)}")
    return loss.reshape(())


def shaped_like_float_targets(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``outputs`` in float32, reshaped to the targets' shape for the mean-squared-error loss
    (refused when the element counts differ)."""
    outputs = outputs.float()
    if outputs.shape != targets.shape:
        if outputs.numel() != targets.numel():
            raise ValueError(
                f"model outputs of shape {tuple(outputs.shape)} do not match float targets of "
                f"shape {tuple(targets.shape)} for the default mean-squared-error loss"
            )
        outputs = outputs.reshape(targets.shape)
    return outputs


def default_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for integer targets, mean squared error for floating ones."""
    if not targets.dtype.is_floating_point:
        return F.cross_entropy(outputs.float(), targets.long())
    return F.mse_loss(shaped_like_float_targets(outputs, targets), targets.float())


def forward_loss(model: nn.Module, batch: Any, user_loss: LossFn | None) -> ForwardResult:
    """Run the model on ``batch`` and compute its loss (see the module docstring)."""
    if user_loss is not None:
        returned = user_loss(model, batch)
        if isinstance(returned, tuple) and len(returned) == 2:
            # compute_loss may return (loss, outputs): outputs then feed val_accuracy.
            loss, outputs = returned
            targets = batch[1] if isinstance(batch, (list, tuple)) and len(batch) == 2 else None
            return ForwardResult(_as_scalar(loss, "compute_loss(model, batch)"), outputs, targets)
        return ForwardResult(_as_scalar(returned, "compute_loss(model, batch)"))
    if isinstance(batch, Mapping):
        output = model(**batch)
        loss = _attached_loss(output)
        if loss is None:
            raise ValueError(_no_loss_message(batch, output))
        return ForwardResult(_as_scalar(loss, "the model output's loss"))
    if not (isinstance(batch, (list, tuple)) and len(batch) == 2):
        kind = (
            f"{type(batch).__name__} of length {len(batch)}"
            if isinstance(batch, (list, tuple))
            else type(batch).__name__
        )
        raise ValueError(
            f"expected (inputs, targets) batches, got a {kind}; define "
            "compute_loss(model, batch) in the model file for other batch layouts"
        )
    inputs, targets = batch
    outputs = model(inputs)
    attached = _attached_loss(outputs)
    if attached is not None:
        return ForwardResult(_as_scalar(attached, "the model output's loss"))
    if not isinstance(outputs, torch.Tensor):
        if _has_loss_field(outputs):  # (a Hugging Face output: its loss needs labels)
            raise ValueError(
                "(inputs, targets) batches are passed as model(inputs), and the model returned "
                f"{type(outputs).__name__} with no loss: a Hugging Face model computes its loss "
                "only when given labels; give it dict batches with 'labels' (a tokens dataset, "
                "or a dataset.py whose samples are dicts) or define compute_loss(model, batch) "
                "in the model file"
            )
        raise TypeError(
            f"the model returned {type(outputs).__name__}; the default loss needs a tensor of "
            "outputs (or an output with .loss, or compute_loss(model, batch) in the model file)"
        )
    return ForwardResult(default_loss(outputs, targets), outputs, targets)


def count_correct(outputs: torch.Tensor | None, targets: torch.Tensor | None) -> int | None:
    """Correct predictions for class logits ``[N, C]`` and integer targets ``[N]``, else None."""
    if outputs is None or targets is None:
        return None
    if outputs.ndim != 2 or targets.ndim != 1 or targets.dtype.is_floating_point:
        return None
    if outputs.shape[0] != targets.shape[0] or outputs.shape[1] < 2:
        return None
    return int((outputs.argmax(dim=1) == targets).sum().item())
