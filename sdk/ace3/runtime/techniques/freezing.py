"""``freeze`` / ``trainable``: which parameters of the model train. Applied on every rank to the
model the user code built, before the parallelism strategy splits, shards or wraps it, so every
strategy sees ``requires_grad=False`` on the frozen parameters: they get no gradient, no
gradient synchronisation and no optimizer state."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from torch import nn

from ace3.config import TrainingConfig
from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.loop.view import LoopView


@dataclass(frozen=True)
class FrozenReport:
    """What froze: parameter tensors and elements, trainable and in all."""

    trainable_tensors: int
    total_tensors: int
    trainable_elements: int
    total_elements: int

    def describe(self) -> str:
        share = self.trainable_elements / self.total_elements if self.total_elements else 0.0
        return (
            f"training {self.trainable_tensors} of {self.total_tensors} parameter tensors "
            f"({self.trainable_elements:,} of {self.total_elements:,} elements, {share:.1%}); "
            "the others are frozen"
        )


def _names_of(parameter_name: str) -> list[str]:
    """The parameter's full name and the names of the modules that hold it."""
    parts = parameter_name.split(".")
    return [".".join(parts[:cut]) for cut in range(len(parts), 0, -1)]


def _matches(parameter_name: str, pattern: str) -> bool:
    return any(fnmatchcase(name, pattern) for name in _names_of(parameter_name))


def apply_freezing(model: nn.Module, config: TrainingConfig) -> FrozenReport | None:
    """Set ``requires_grad`` from ``config.freeze`` / ``config.trainable``; None when neither
    is set. ValueError naming the pattern when one matches no parameter, or when nothing would
    train."""
    patterns = config.freeze or config.trainable
    if not patterns:
        return None
    field = "freeze" if config.freeze else "trainable"
    named = list(model.named_parameters())
    for pattern in patterns:
        if not any(_matches(name, pattern) for name, _ in named):
            shown = ", ".join(name for name, _ in named[:12])
            more = f", ... ({len(named)} in all)" if len(named) > 12 else ""
            raise ValueError(
                f"{field}: the pattern {pattern!r} matches no parameter or module of the model "
                f"(its parameters: {shown}{more})"
            )
    for name, param in named:
        hit = any(_matches(name, pattern) for pattern in patterns)
        param.requires_grad_(not hit if field == "freeze" else hit)
    report = FrozenReport(
        trainable_tensors=sum(1 for _, p in named if p.requires_grad),
        total_tensors=len(named),
        trainable_elements=sum(p.numel() for _, p in named if p.requires_grad),
        total_elements=sum(p.numel() for _, p in named),
    )
    if report.trainable_tensors == 0:
        raise ValueError(
            f"{field}={patterns!r} leaves no parameter to train: every parameter of the model "
            "would be frozen"
        )
    return report


class ParameterCounts(LoopExtension):
    """``final_metrics["trainable_parameters"]`` and ``["total_parameters"]`` (elements) of a run
    without LoRA, whose extension reports its own: counted on the whole model as built, before
    a strategy splits or shards it."""

    def __init__(self, model: nn.Module) -> None:
        params = list(model.parameters())  # (a tied weight once)
        self.trainable = sum(p.numel() for p in params if p.requires_grad)
        self.total = sum(p.numel() for p in params)

    def finish(self, loop: LoopView) -> dict[str, Any]:
        return {"trainable_parameters": self.trainable, "total_parameters": self.total}
