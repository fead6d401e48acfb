"""The engine's hooks for a run: what the job config asks for, plus the caller's own.

From the config: ``callbacks`` (rebuilt from their specs), ``tensorboard`` (event files) and
``profiler`` (torch.profiler on rank 0). An in-process run passes its live objects as
``extra`` hooks instead of specs.
"""

from __future__ import annotations

from collections.abc import Sequence

from ace3.config import TrainingConfig
from ace3.runtime.loop.hooks import HookList, TrainingHook
from ace3.runtime.process.distributed import DistContext


def engine_hooks(
    config: TrainingConfig, ctx: DistContext, extra: Sequence[TrainingHook] = ()
) -> HookList:
    hooks: list[TrainingHook] = []
    if config.callbacks:
        from ace3.runtime.observe.callback_hook import CallbackHook
        from ace3.training.callbacks.transport import callbacks_from_specs

        hooks.append(CallbackHook(callbacks_from_specs(config.callbacks)))
    if config.tensorboard is not None:
        from ace3.runtime.observe.tensorboard_hook import TensorBoardHook

        hooks.append(TensorBoardHook(config.tensorboard))
    if config.profiler is not None:
        from ace3.runtime.observe.profiler_hook import ProfilerHook

        hooks.append(ProfilerHook(config.profiler))
    hooks.extend(extra)
    return HookList(hooks)
