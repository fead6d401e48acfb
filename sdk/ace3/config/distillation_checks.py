"""Distillation combinations the engine cannot run, refused up front with the reason (part of
:func:`ace3.config.unsupported.unsupported_settings`)."""

from __future__ import annotations

from ace3.config.layout import runs_pipeline, runs_tensor_parallel
from ace3.config.training import TrainingConfig


def distillation_problems(config: TrainingConfig) -> list[tuple[str, str]]:
    """(field, reason) for each setting distillation does not compose with."""
    if config.distillation is None:
        return []
    problems = []
    if runs_pipeline(config):
        problems.append(
            (
                "distillation",
                "cannot run with pipeline parallelism: each stage holds a slice of the "
                "student and only the last one sees its logits, while the teacher needs the "
                "batch's inputs and the whole student output; use data parallelism (DDP, ZeRO-1 or "
                "FSDP)",
            )
        )
    if runs_tensor_parallel(config):
        problems.append(
            (
                "distillation",
                "cannot run with tensor parallelism: the student's logits and hidden states "
                "are sharded over the ranks, which the distillation losses do not gather; use "
                "data parallelism (DDP, ZeRO-1 or FSDP)",
            )
        )
    if config.offload:
        problems.append(
            (
                "distillation",
                "cannot run with CPU offload yet: the teacher, the projections and the "
                "offloaded student would live on different devices; turn offload off "
                "(zero_stage 0-3 without offload all work)",
            )
        )
    return problems
