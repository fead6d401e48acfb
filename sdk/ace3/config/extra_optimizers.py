"""Settings of the optimizers beyond the Adam family and SGD (``optimizer = "lion" | "sophia"
| "galore_adamw" | "adafactor"``), each named by its optimizer. ``TrainingConfig`` inherits
:class:`ExtraOptimizerFields`; the engine builds them in :mod:`ace3.runtime.loop.extra_optimizers`.

Every field defaults to None, which means the optimizer's own default (given in its
description); setting one for another optimizer is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from ace3.config.training import TrainingConfig
    from ace3.config.unsupported import ConfigProblem

#: The optimizers from the ``pytorch-optimizer`` package (``pip install 'ace3[optimizers]'``).
LIBRARY_OPTIMIZERS = ("lion", "sophia", "galore_adamw")
EXTRA_OPTIMIZERS = (*LIBRARY_OPTIMIZERS, "adafactor")
GaLoreProjection = Literal["std", "reverse_std", "right", "left", "full"]

#: Each optimizer-specific field -> the optimizer it belongs to.
FIELD_OWNERS = {
    "lion_betas": "lion",
    "sophia_betas": "sophia",
    "sophia_rho": "sophia",
    "sophia_update_period": "sophia",
    "galore_rank": "galore_adamw",
    "galore_update_proj_gap": "galore_adamw",
    "galore_scale": "galore_adamw",
    "galore_proj_type": "galore_adamw",
    "adafactor_beta2_decay": "adafactor",
    "adafactor_eps": "adafactor",
    "adafactor_d": "adafactor",
}
#: The defaults the engine uses for a field left at None.
DEFAULTS = {
    "lion_betas": (0.9, 0.99),
    "sophia_betas": (0.96, 0.99),
    "sophia_rho": 0.04,
    "sophia_update_period": 10,
    "galore_rank": 128,
    "galore_update_proj_gap": 200,
    "galore_scale": 0.25,
    "galore_proj_type": "std",
    "adafactor_beta2_decay": -0.8,
    "adafactor_eps": (None, 1e-3),
    "adafactor_d": 1.0,
}


class ExtraOptimizerFields(BaseModel):
    """Lion, Sophia, GaLore-AdamW and Adafactor settings (None: the default in brackets)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lion_betas: tuple[float, float] | None = Field(
        None,
        description="Lion (beta1, beta2) [(0.9, 0.99)]: the update is sign(beta1 m + (1 - "
        "beta1) g); the momentum m then decays with beta2.",
    )
    sophia_betas: tuple[float, float] | None = Field(
        None,
        description="Sophia (beta1, beta2) [(0.96, 0.99)]: decay of the gradient momentum and "
        "of the Hessian-diagonal estimate.",
    )
    sophia_rho: float | None = Field(
        None,
        gt=0.0,
        le=10.0,
        description="Sophia's clip [0.04]: each coordinate of m / max(h, eps) is clipped to "
        "[-rho, rho] before the lr scales it.",
    )
    sophia_update_period: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Sophia: optimizer steps between Hutchinson Hessian estimates [10] (those "
        "steps run their backward pass with create_graph=True).",
    )
    galore_rank: int | None = Field(
        None,
        ge=1,
        le=65_536,
        description="GaLore: rank of the gradient projection of every 2-D weight [128].",
    )
    galore_update_proj_gap: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="GaLore: optimizer steps between recomputations of the projection (an SVD "
        "of the gradient) [200].",
    )
    galore_scale: float | None = Field(
        None, gt=0.0, le=100.0, description="GaLore: scale of the projected-back update [0.25]."
    )
    galore_proj_type: GaLoreProjection | None = Field(
        None,
        description="GaLore: which side(s) the gradient is projected on [std: the smaller one].",
    )
    adafactor_beta2_decay: float | None = Field(
        None,
        ge=-10.0,
        le=0.0,
        description="Adafactor: the second moment decays with beta2_t = 1 - t^beta2_decay "
        "[-0.8] (torch.optim.Adafactor).",
    )
    adafactor_eps: tuple[float | None, float] | None = Field(
        None,
        description="Adafactor (eps1, eps2) [(None, 1e-3)]: eps1 floors the second moment "
        "(None: the dtype's eps), eps2 the relative step (torch.optim.Adafactor).",
    )
    adafactor_d: float | None = Field(
        None,
        gt=0.0,
        le=1e6,
        description="Adafactor: clipping threshold d of the update's RMS [1.0].",
    )

    @field_validator("lion_betas", "sophia_betas")
    @classmethod
    def _optimizer_betas_in_unit_interval(
        cls, betas: tuple[float, float] | None
    ) -> tuple[float, float] | None:
        if betas is not None and not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"betas {betas} must both be in [0, 1)")
        return betas

    @field_validator("adafactor_eps")
    @classmethod
    def _adafactor_eps_in_range(
        cls, eps: tuple[float | None, float] | None
    ) -> tuple[float | None, float] | None:
        if eps is not None and not all(e is None or 0.0 < e <= 1.0 for e in eps):
            raise ValueError(f"adafactor_eps {eps}: each must be in (0, 1] (eps1 may be None)")
        return eps


def optimizer_setting(config: TrainingConfig, field: str) -> object:
    """The value the engine uses for an optimizer-specific ``field``: the config's, or the
    default."""
    value = getattr(config, field)
    return DEFAULTS[field] if value is None else value


def extra_optimizer_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """Optimizer-specific settings given for another optimizer, and the layouts the new
    optimizers do not run with, each with its reason."""
    from ace3.config.layout import runs_pipeline, runs_tensor_parallel
    from ace3.config.unsupported import ConfigProblem  # (it imports this module's users)

    problems: list[ConfigProblem] = []

    def refuse(field: str, reason: str) -> None:
        problems.append(ConfigProblem(field=field, reason=f"{field}: {reason}"))

    name = config.optimizer
    for field, owner in FIELD_OWNERS.items():
        if getattr(config, field) is not None and owner != name:
            refuse(field, f"a setting of optimizer={owner!r}, but optimizer={name!r}: remove "
                   f"it or set optimizer={owner!r}")  # fmt: skip
    if name in ("lion", "sophia", "adafactor") and tuple(config.betas) != (0.9, 0.999):
        own = "lion_betas" if name == "lion" else "sophia_betas"
        refuse("betas", f"the Adam family's; optimizer={name!r} does not use them"
               + ("" if name == "adafactor" else f": set {own}"))  # fmt: skip
    if name not in EXTRA_OPTIMIZERS:
        return problems
    if runs_pipeline(config) or runs_tensor_parallel(config):
        refuse("optimizer", f"{name!r} with pipeline or tensor parallelism is not implemented: "
               "use data parallelism (zero_stage 0)")  # fmt: skip
    elif config.effective_zero_stage >= 1:
        refuse("optimizer", f"{name!r} with ZeRO-{config.effective_zero_stage} is not "
               "implemented (its state is not sharded by ZeroRedundancyOptimizer or FSDP here): "
               "use zero_stage=0 and no offload")  # fmt: skip
    if name == "sophia":
        if config.world_size > 1:
            refuse("optimizer", "'sophia' runs on one process: its Hutchinson Hessian estimate "
                   "differentiates the gradient's own graph (create_graph=True), which DDP's "
                   "all-reduce does not keep; use num_gpus=1 and num_nodes=1")  # fmt: skip
        if config.mixed_precision:
            refuse("mixed_precision", "not implemented with optimizer='sophia' (the Hessian "
                   "estimate would differentiate the scaled 16-bit gradients): turn it off")  # fmt: skip
        if config.max_grad_norm is not None:
            refuse("max_grad_norm", "optimizer='sophia' clips its own update per coordinate "
                   "(sophia_rho); clipping the gradient in place would break the graph its "
                   "Hessian estimate needs: remove max_grad_norm")  # fmt: skip
        if config.distillation is not None:
            refuse("distillation", "not implemented with optimizer='sophia': use another "
                   "optimizer")  # fmt: skip
    if name == "galore_adamw" and config.lora is not None:
        refuse("lora", "GaLore and LoRA are two ways to train with low-rank updates: use one")
    return problems
