"""Speed settings of :class:`~ace3.config.training.TrainingConfig`: ``torch.compile``, TF32,
the optimizer's kernel implementation and the attention kernels. Kept apart so that the
training schema stays readable; ``TrainingConfig`` inherits :class:`SpeedFields`. What the
engine does with them: :mod:`ace3.runtime.loop.speed`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from ace3.config.training import TrainingConfig
    from ace3.config.unsupported import ConfigProblem

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


def speed_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """What the speed settings cannot run with, each with its reason (for
    :func:`ace3.config.unsupported.unsupported_settings`)."""
    from ace3.config.layout import runs_pipeline, runs_tensor_parallel
    from ace3.config.unsupported import ConfigProblem  # (it imports this module's users)

    problems: list[ConfigProblem] = []

    def refuse(field: str, reason: str) -> None:
        problems.append(ConfigProblem(field=field, reason=f"{field}: {reason}"))

    if not config.compile:
        for name, default in (("compile_mode", "default"), ("compile_fullgraph", False)):
            if getattr(config, name) != default:
                refuse(name, "only used with compile=True: set compile=True or remove it")
    else:
        if runs_pipeline(config):
            refuse("compile", "not implemented with pipeline parallelism (the stages are "
                   "built and run by torch.distributed.pipelining); use data parallelism or "
                   "ZeRO")  # fmt: skip
        elif runs_tensor_parallel(config):
            refuse("compile", "not implemented with tensor parallelism (the sharded layers' "
                   "DTensor redistributions are not traced); use data parallelism or ZeRO")  # fmt: skip
        if config.optimizer == "sophia":
            refuse("compile", "optimizer='sophia' needs the gradient's own graph "
                   "(create_graph=True) for its Hessian estimate, and compiled graphs do not "
                   "support double backward: use compile=False")  # fmt: skip
        if config.quantization is not None:
            refuse("compile", "not implemented with quantization (the int8 model is made from "
                   "a copy of the trained module, whose compiled forward belongs to the "
                   "original): quantize without compile")  # fmt: skip
        if config.pruning is not None:
            refuse("compile", "not implemented with pruning (its masks re-parametrize the "
                   "weights through forward hooks that change during training): prune "
                   "without compile")  # fmt: skip
    if config.optimizer_impl != "auto" and config.optimizer not in TORCH_IMPL_OPTIMIZERS:
        refuse("optimizer_impl", f"{config.optimizer_impl!r} chooses the kernels of torch's "
               f"Adam, AdamW and SGD; optimizer={config.optimizer!r} has its own: use "
               "optimizer_impl='auto'")  # fmt: skip
    return problems
