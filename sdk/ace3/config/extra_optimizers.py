"""Settings of the optimizers beyond the Adam family and SGD (``optimizer = "lion" | "sophia"
| "galore_adamw" | "adafactor"``), each named by its optimizer. ``TrainingConfig`` inherits
:class:`ExtraOptimizerFields`; the engine builds them in :mod:`ace3.runtime.loop.extra_optimizers`.

Every field defaults to None, which means the optimizer's own default (given in its
description); setting one for another optimizer is refused.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


def optimizer_setting(config: ExtraOptimizerFields, field: str) -> object:
    """The value the engine uses for an optimizer-specific ``field``: the config's, or the
    default."""
    value = getattr(config, field)
    return DEFAULTS[field] if value is None else value
