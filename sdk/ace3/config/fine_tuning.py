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
    ValidationInfo,
    field_validator,
    model_validator,
)

MAX_PATTERNS = 256
CHECKPOINT_ID_RE = re.compile(r"^[0-9a-f]{32}$")
START_WEIGHTS = ("init_from", "init_from_checkpoint_id")  # where the weights come from

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

    def __setattr__(self, name: str, value: Any) -> None:
        """``config.init_from = source`` is construction's ``init_from``: the two fields become
        what ``type(config)(**other settings, init_from=source)`` gives (a stored checkpoint's id
        in ``init_from_checkpoint_id``, a local path in ``init_from``, the other one None), and
        a refused source raises construction's ValidationError, leaving the config as it was.
        It replaces where the weights come from, so an earlier ``init_from_checkpoint_id`` goes
        (``None`` starts from no weights). pydantic's own assignment could not do this: it
        validates the assigned value as the field's type (a handle refused) and applies what the
        model validator returns to the other fields (an id string set both)."""
        if name != "init_from":
            super().__setattr__(name, value)
            return
        settings = {
            key: getattr(self, key) for key in self.model_fields_set if key not in START_WEIGHTS
        }
        rebuilt = type(self).model_validate({**settings, "init_from": value})
        for key in START_WEIGHTS:
            self.__dict__[key] = getattr(rebuilt, key)
        self.__pydantic_fields_set__.difference_update(START_WEIGHTS)
        self.__pydantic_fields_set__.update(rebuilt.model_fields_set.intersection(START_WEIGHTS))

    @model_validator(mode="before")
    @classmethod
    def _init_from_reference(cls, data: Any, info: ValidationInfo) -> Any:
        """``init_from``: a stored checkpoint (a handle with an ``id``, or its id) becomes
        ``init_from_checkpoint_id``; a local file stays ``init_from`` (its path); anything else
        is left for ``_local_file_name`` to refuse. At construction only: an assignment
        (``info.field_name``) changes one field, and ``init_from``'s is ``__setattr__``'s."""
        if info.field_name is not None or not isinstance(data, dict):
            return data
        source = data.get("init_from")
        if source is None:
            return data
        if isinstance(source, os.PathLike):
            return {**data, "init_from": os.fspath(source)}
        if isinstance(source, str):  # an id, or a path (a local file named like an id: a Path)
            checkpoint_id = source if CHECKPOINT_ID_RE.match(source) else None
        else:
            checkpoint_id = getattr(source, "id", None)
        if not isinstance(checkpoint_id, str):
            return data  # a local path, or what _local_file_name refuses
        earlier = data.get("init_from_checkpoint_id")
        if earlier is not None and earlier != checkpoint_id:
            raise ValueError(
                f"init_from names checkpoint {checkpoint_id} but init_from_checkpoint_id is "
                f"{earlier}: set one of them"
            )
        return {**data, "init_from_checkpoint_id": checkpoint_id, "init_from": None}

    @field_validator("init_from", mode="before")
    @classmethod
    def _local_file_name(cls, value: Any) -> Any:
        """What is left in ``init_from`` is a local path (a field validator, so that the error
        names ``init_from``)."""
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(
                f"init_from must be a stored checkpoint (a Checkpoint or its id) or the path of "
                f"a local checkpoint file, not {type(value).__name__}"
            )
        if not value.strip():
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
