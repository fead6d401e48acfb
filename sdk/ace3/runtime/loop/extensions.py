"""Loop extensions: parts of the engine that act on the model at fixed points of the training
loop (:class:`ace3.runtime.loop.loop.TrainingLoop`), without branches of their own in it.

The loop calls every extension of ``Components.extensions`` on every rank, in list order, at
the same points, so an extension may run collectives (validation, broadcasts). It sees the
loop through :class:`ace3.runtime.loop.view.LoopView` (what it may read, and the operations the
loop performs for it)::

    start(loop)        once, before the first step (after the hooks' on_train_begin)
    before_forward()   in each optimizer step, before its first micro-batch (again when an
                       out-of-memory step is retried in place)
    after_optimizer_step(loss_scale, skipped, learning_rate)
                       in each optimizer step, right after the model's optimizer step (or the
                       step the scaler or the guard skipped)
    after_step(loop)   after each optimizer step (loop.state.step counts it already)
    training_metrics() entries for each training-metrics report (every rank: a collective)
    step_end(loop)     at the end of each step, after its metrics, its checkpoint and the
                       stop check (preemption stops here: :mod:`ace3.runtime.loop.preemption`)
    after_validation(loop)
                       after each validation (at each epoch's end and the run's last step;
                       its metrics already reported): eval_prompts' samples
    saving()           a context around every checkpoint the loop writes
    finish(loop)       after the final checkpoint; returns entries for the summary
    on_instability(loop, reason)
                       the instability guard found a step unstable and warned, skipped it or
                       rolled the run back (after the rollback; every rank at the same step;
                       batch-size growth shrinks the batch); not when it stops the run
    close()            always, last, however the run ended (an exception included)

:func:`ace3.runtime.techniques.compression.compression_extensions` builds pruning and
quantization; knowledge distillation (:mod:`ace3.runtime.techniques.distillation`) is one too.
"""

from __future__ import annotations

import contextlib
from fnmatch import fnmatchcase
from typing import Any

from torch import nn

from ace3.runtime.loop.view import LoopView


class LoopExtension:
    """Base class: every point is a no-op (see the module docstring for when each runs)."""

    def start(self, loop: LoopView) -> None:
        return None

    def before_forward(self) -> None:
        return None

    def after_optimizer_step(self, loss_scale: float, skipped: bool, learning_rate: float) -> None:
        return None

    def after_step(self, loop: LoopView) -> None:
        return None

    def training_metrics(self) -> dict[str, float]:
        return {}

    def step_end(self, loop: LoopView) -> None:
        return None

    def after_validation(self, loop: LoopView) -> None:
        return None

    def saving(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def on_instability(self, loop: LoopView, reason: str) -> None:
        return None

    def finish(self, loop: LoopView) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        return None


def matching_modules(
    model: nn.Module,
    patterns: list[str] | None,
    kinds: tuple[type[nn.Module], ...],
    field: str,
) -> list[tuple[str, nn.Module]]:
    """The modules of ``kinds`` whose names match one of ``patterns`` (fnmatch; every one when
    None), in model order. ValueError naming ``field`` when a pattern matches none of them, or
    when there is none at all."""
    candidates = [(name, m) for name, m in model.named_modules() if isinstance(m, kinds)]
    what = " or ".join(kind.__name__ for kind in kinds)
    if not candidates:
        raise ValueError(f"{field}: the model has no {what} layer")
    if not patterns:
        return candidates
    shown = ", ".join(name or "<root>" for name, _ in candidates[:12])
    more = f", ... ({len(candidates)} in all)" if len(candidates) > 12 else ""
    for pattern in patterns:
        if not any(fnmatchcase(name, pattern) for name, _ in candidates):
            raise ValueError(
                f"{field}: the pattern {pattern!r} matches no {what} layer of the model "
                f"(its {what} layers: {shown}{more})"
            )
    return [(n, m) for n, m in candidates if any(fnmatchcase(n, p) for p in patterns)]
