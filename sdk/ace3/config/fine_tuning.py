"""The fine-tuning settings of :class:`~ace3.config.training.TrainingConfig`: which parameters
train. Kept apart so that the training schema stays readable; ``TrainingConfig`` inherits them."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

MAX_PATTERNS = 256

ParameterPattern = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)
]


class FineTuningFields(BaseModel):
    """``freeze`` / ``trainable``: fnmatch patterns over the model's parameter and module names
    (``"embed*"``, ``"layers.0.*"``, ``"head"``). A pattern matches a parameter when it matches
    its full name or the name of a module that holds it. ``freeze`` keeps the matching
    parameters as they are; ``trainable`` trains only the matching ones (the fourth seed's
    "unfreeze the top layers"). Frozen parameters get no gradient and no optimizer state."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    freeze: list[ParameterPattern] | None = Field(
        None,
        max_length=MAX_PATTERNS,
        description="Parameter/module name patterns (fnmatch) kept frozen.",
    )
    trainable: list[ParameterPattern] | None = Field(
        None,
        max_length=MAX_PATTERNS,
        description="The only parameter/module name patterns (fnmatch) that train.",
    )

    @model_validator(mode="after")
    def _freeze_or_trainable(self) -> FineTuningFields:
        if self.freeze and self.trainable:
            raise ValueError(
                "freeze and trainable cannot both be set: freeze names what stays fixed, "
                "trainable names the only parameters that train; use one of them"
            )
        return self
