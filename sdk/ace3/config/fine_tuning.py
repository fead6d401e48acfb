"""The fine-tuning settings of :class:`~ace3.config.training.TrainingConfig`: the weights a
job starts from and which parameters train. Kept apart so that the training schema stays
readable; ``TrainingConfig`` inherits them."""

from __future__ import annotations

import os
import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

MAX_PATTERNS = 256
CHECKPOINT_ID_RE = re.compile(r"^[0-9a-f]{32}$")

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

    init_from_checkpoint_id: str | None = Field(
        None,
        pattern=CHECKPOINT_ID_RE.pattern,
        description="Start from the model weights of this stored checkpoint (one of your jobs' "
        "checkpoints, or weights uploaded with POST /v1/checkpoints): fine-tuning, not a resume "
        "(a fresh optimizer and schedule, step 0).",
    )
    init_from: str | None = Field(
        None,
        max_length=4096,
        description="SDK only: a local checkpoint file to start from. The SDK uploads it as "
        "weights and sends init_from_checkpoint_id instead (the service refuses a path); an "
        "in-process run loads it.",
    )
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

    @model_validator(mode="before")
    @classmethod
    def _init_from_reference(cls, data: Any) -> Any:
        """``init_from``: a stored checkpoint (a handle with an ``id``, or its id) becomes
        ``init_from_checkpoint_id``; a local file stays ``init_from`` (its path)."""
        if not isinstance(data, dict) or data.get("init_from") is None:
            return data
        data = dict(data)
        source = data["init_from"]
        checkpoint_id = None
        if not isinstance(source, str | os.PathLike):
            checkpoint_id = getattr(source, "id", None)
            if not isinstance(checkpoint_id, str):
                raise ValueError(
                    f"init_from must be a stored checkpoint (a Checkpoint or its id) or the path "
                    f"of a local checkpoint file, not {type(source).__name__}"
                )
        elif isinstance(source, str) and CHECKPOINT_ID_RE.match(source):
            checkpoint_id = source  # (a local file of that name: pass a Path)
        if checkpoint_id is None:
            data["init_from"] = os.fspath(source)
            return data
        earlier = data.get("init_from_checkpoint_id")
        if earlier is not None and earlier != checkpoint_id:
            raise ValueError(
                f"init_from names checkpoint {checkpoint_id} but init_from_checkpoint_id is "
                f"{earlier}: set one of them"
            )
        data["init_from_checkpoint_id"] = checkpoint_id
        data["init_from"] = None
        return data

    @field_validator("init_from")
    @classmethod
    def _local_file_name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("init_from must name a checkpoint file")
        return value

    @model_validator(mode="after")
    def _freeze_or_trainable(self) -> FineTuningFields:
        if self.freeze and self.trainable:
            raise ValueError(
                "freeze and trainable cannot both be set: freeze names what stays fixed, "
                "trainable names the only parameters that train; use one of them"
            )
        return self
