"""The compression extensions a config asks for: pruning (:mod:`ace3.runtime.techniques.pruning`)
then post-training quantization (:mod:`ace3.runtime.techniques.quantization`), in that order
(the int8 model is made from the pruned one)."""

from __future__ import annotations

from torch import nn

from ace3.config import TrainingConfig
from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.process.distributed import DistContext


def compression_extensions(
    config: TrainingConfig, model: nn.Module, ctx: DistContext, total_steps: int
) -> list[LoopExtension]:
    """The extensions ``config`` asks for, built over this rank's ``model`` (a bad setting
    fails here, before the first step)."""
    found: list[LoopExtension] = []
    if config.pruning is not None:
        from ace3.runtime.techniques.pruning import Pruner

        found.append(Pruner(config.pruning, model, ctx, total_steps))
    if config.quantization is not None:
        from ace3.runtime.techniques.quantization import PostTrainingQuantization

        found.append(PostTrainingQuantization(config.quantization, model))
    return found
