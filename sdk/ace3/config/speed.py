"""Speed settings of :class:`~ace3.config.training.TrainingConfig`: ``torch.compile``, TF32,
the optimizer's kernel implementation and the attention kernels. Kept apart so that the
training schema stays readable; ``TrainingConfig`` inherits :class:`SpeedFields`. What the
engine does with them: :mod:`ace3.runtime.loop.speed`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
OptimizerImpl = Literal["auto", "fused", "foreach", "for_loop"]
AttentionBackend = Literal["auto", "flash", "efficient", "math"]

#: The optimizers whose torch classes take ``fused`` / ``foreach``.
TORCH_IMPL_OPTIMIZERS = ("adamw", "adam", "sgd")
#: The attention backends that exist only as CUDA kernels.
CUDA_ONLY_ATTENTION = ("flash", "efficient")


class SpeedFields(BaseModel):
    """``compile``, ``compile_mode``, ``allow_tf32``, ``optimizer_impl``,
    ``attention_backend``."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    compile: bool = Field(
        False,
        description="torch.compile the model (in place: checkpoints keep the plain parameter "
        "names). Composed with DDP, ZeRO-1 and FSDP (compiled after sharding) and with "
        "gradient checkpointing; refused with pipeline or tensor parallelism.",
    )
    compile_mode: CompileMode = Field(
        "default",
        description="torch.compile mode: default, reduce-overhead (CUDA graphs), max-autotune "
        "or max-autotune-no-cudagraphs. Only with compile=True.",
    )
    compile_fullgraph: bool = Field(
        False,
        description="torch.compile(fullgraph=True): fail on a graph break instead of running "
        "that part eagerly. Only with compile=True.",
    )
    allow_tf32: bool = Field(
        False,
        description="CUDA only: let float32 matmuls and convolutions use TensorFloat-32 "
        "(torch.backends.cuda.matmul.allow_tf32 / cudnn.allow_tf32; Ampere and newer). On a "
        "CPU worker there is no TF32, so the setting does nothing there (float32 stays exact).",
    )
    optimizer_impl: OptimizerImpl = Field(
        "auto",
        description="The optimizer's kernels (adamw, adam, sgd): auto = fused on CUDA when "
        "every parameter is a CUDA floating tensor, torch's default (foreach on CUDA, a loop "
        "on the CPU) otherwise; fused = one fused kernel (CUDA, and the CPU's in torch >= "
        "2.4); foreach = multi-tensor kernels; for_loop = one parameter at a time.",
    )
    attention_backend: AttentionBackend = Field(
        "auto",
        description="Kernels torch.nn.functional.scaled_dot_product_attention may use "
        "(torch.nn.attention.sdpa_kernel, for the whole run): auto = any; flash and "
        "efficient are CUDA kernels (refused on a CPU worker); math = the reference one.",
    )
