"""Gradient communication settings of :class:`~ace3.config.training.TrainingConfig`:
``communication_data_type`` (the dtype gradients are reduced in) and ``ddp_bucket_cap_mb``
(DDP's all-reduce bucket size). ``TrainingConfig`` inherits :class:`CommunicationFields`; the
engine applies them in :mod:`ace3.runtime.parallel.communication`. From a DeepSpeed dict:
``communication_data_type`` as it is, ``reduce_scatter_base_size`` (elements) as
``ddp_bucket_cap_mb``, ``allgather_base_size`` refused (:mod:`ace3.config.deepspeed`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CommunicationDataType = Literal["fp32", "fp16", "bf16"]


class CommunicationFields(BaseModel):
    """``communication_data_type``, ``ddp_bucket_cap_mb``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    communication_data_type: CommunicationDataType | None = Field(
        None,
        description="The dtype gradients are averaged over the data-parallel replicas in: fp16 "
        "or bf16 halve the bytes sent (DDP's fp16/bf16 compression hooks at ZeRO 0/1, FSDP2's "
        "MixedPrecisionPolicy(reduce_dtype) at ZeRO 2/3, the same cast in the pipeline/tensor "
        "layouts' reduction), at the cost of rounding the averaged gradient; None or fp32: the "
        "gradients' own dtype (float32 unless amp_level is O2/O3).",
    )
    ddp_bucket_cap_mb: float | None = Field(
        None,
        gt=0.0,
        le=4096.0,
        description="DDP's bucket_cap_mb: gradients are all-reduced in buckets of about this "
        "many MiB, overlapped with the backward pass (DDP's default: 25). ZeRO 0/1 data "
        "parallelism only: FSDP reduce-scatters one unit at a time.",
    )


def communication_problems(config: Any, split: bool) -> list[tuple[str, str]]:
    """(field, reason) for communication settings a layout cannot honour (``split``: the
    config runs pipeline or tensor parallelism)."""
    problems: list[tuple[str, str]] = []
    if config.ddp_bucket_cap_mb is not None and (split or config.effective_zero_stage >= 2):
        where = (
            "pipeline and tensor parallelism average gradients in the engine's own buckets"
            if split
            else f"ZeRO-{config.effective_zero_stage} runs on FSDP, which reduce-scatters each "
            "unit's gradients as one collective"
        )
        problems.append(("ddp_bucket_cap_mb", f"DDP's bucket size (zero_stage 0 or 1); {where}: "
                         "remove it"))  # fmt: skip
    if (
        config.communication_data_type == "fp32"
        and config.mixed_precision
        and config.amp_level in ("O2", "O3")
    ):
        problems.append(("communication_data_type", f"'fp32' with amp_level={config.amp_level!r}: "
                         "the gradients are 16-bit there and are reduced as such; leave it "
                         "unset, or use amp_level='O1'"))  # fmt: skip
    return problems
