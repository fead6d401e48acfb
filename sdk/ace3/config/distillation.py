"""Knowledge distillation settings: ``TrainingConfig(distillation=DistillationConfig(...))``.

On the wire (JSON) the teacher travels as ids: ``teacher_model_id`` (a stored model, checked
for ownership like ``model_id``) and ``teacher_checkpoint_id`` (a stored checkpoint). In Python
``teacher=`` also takes a handle (anything with a string ``.id``, e.g. what
``client.load_model(path)`` returns) or a live ``torch.nn.Module`` for in-process runs, and
``teacher_checkpoint=`` a handle, a stored checkpoint's id or a local weights file. The live
module and the local file never go on the wire (a remote job with a live module is refused by the
SDK before anything is uploaded; a local weights file is uploaded first, like ``init_from``'s,
and sent as ``teacher_checkpoint_id``). No torch import here: handles and modules are recognised by
duck typing.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
    model_validator,
)

ModuleName = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
StoredId = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
MAX_FEATURE_PAIRS = 64
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")
# Python-only fields: kept by model_dump() (so configs rebuilt from a dump keep them), left out
# of every JSON dump (the wire).
LOCAL_ONLY_FIELDS = ("teacher_module", "teacher_checkpoint_path")


def _looks_like_module(value: Any) -> bool:
    """A torch.nn.Module, without importing torch."""
    return any(
        cls.__name__ == "Module" and cls.__module__ == "torch.nn.modules.module"
        for cls in type(value).__mro__
    )


def _stored_id(value: Any) -> str | None:
    """The id of a handle (an object with a string ``.id``), else None."""
    ident = getattr(value, "id", None)
    return ident if isinstance(ident, str) and ident else None


def _looks_like_file(value: str) -> bool:
    """A path rather than a stored id (decided from the text alone: the API validates this
    model too, and must not look at its own filesystem)."""
    return os.sep in value or "/" in value or value.endswith(WEIGHT_SUFFIXES)


class DistillationConfig(BaseModel):
    """Train the model (the student) to match a teacher: ``alpha * T^2 * KL(teacher || student)``
    on logits softened by ``temperature`` T, plus ``(1 - alpha) *`` the task loss, plus
    ``feature_loss_weight *`` the hidden-state loss over ``feature_layers`` (student module ->
    teacher module; a learned linear projection when the widths differ), plus
    ``attention_loss_weight *`` the attention-map loss (models whose output has ``.attentions``).
    The teacher runs in eval mode without gradients, on every rank, in the job's precision."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    teacher_model_id: StoredId | None = Field(
        None, description="The stored model (model file) that builds the teacher."
    )
    teacher_checkpoint_id: StoredId | None = Field(
        None, description="A stored checkpoint holding the teacher's weights."
    )
    teacher_model_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the teacher model's factory."
    )
    temperature: float = Field(2.0, gt=0, le=100, allow_inf_nan=False)
    alpha: float = Field(0.5, ge=0, le=1, allow_inf_nan=False)
    feature_layers: dict[ModuleName, ModuleName] = Field(
        default_factory=dict,
        max_length=MAX_FEATURE_PAIRS,
        description="Student module name -> teacher module name whose outputs are matched.",
    )
    feature_loss_weight: float | None = Field(
        None,
        ge=0,
        le=1e6,
        allow_inf_nan=False,
        description="Weight of the feature loss (None: 0.1 when feature_layers are given).",
    )
    hidden_loss: Literal["mse", "cosine"] = "mse"
    attention_loss_weight: float = Field(0.0, ge=0, le=1e6, allow_inf_nan=False)
    # In-process only (never on the wire): a live teacher module, a local weights file.
    teacher_module: Annotated[Any, PlainSerializer(lambda _: None, when_used="json")] = Field(
        None, repr=False
    )
    teacher_checkpoint_path: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _teacher_inputs(cls, data: Any) -> Any:
        """``teacher=`` / ``teacher_checkpoint=`` into the fields above."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "teacher" in data:
            teacher = data.pop("teacher")
            if teacher is None:
                pass
            elif _looks_like_module(teacher):
                data["teacher_module"] = teacher
            elif (ident := _stored_id(teacher)) is not None:
                data["teacher_model_id"] = ident
            elif isinstance(teacher, str):
                data["teacher_model_id"] = teacher
            else:
                raise ValueError(
                    f"teacher must be a stored model (client.load_model(...) or its id) or a "
                    f"torch.nn.Module for an in-process run, not {type(teacher).__name__}"
                )
        if "teacher_checkpoint" in data:
            weights = data.pop("teacher_checkpoint")
            if weights is None:
                pass
            elif isinstance(weights, os.PathLike):
                data["teacher_checkpoint_path"] = os.fspath(weights)
            elif (ident := _stored_id(weights)) is not None:
                data["teacher_checkpoint_id"] = ident
            elif isinstance(weights, str):
                key = (
                    "teacher_checkpoint_path"
                    if _looks_like_file(weights)
                    else "teacher_checkpoint_id"
                )
                data[key] = weights
            else:
                raise ValueError(
                    "teacher_checkpoint must be a stored checkpoint (a handle or its id) or a "
                    f"local weights file path, not {type(weights).__name__}"
                )
        return data

    @model_validator(mode="after")
    def _consistent(self) -> DistillationConfig:
        if self.teacher_module is not None and not _looks_like_module(self.teacher_module):
            raise ValueError("teacher_module must be a torch.nn.Module")
        teachers = [self.teacher_model_id is not None, self.teacher_module is not None]
        if sum(teachers) != 1:
            raise ValueError(
                "distillation needs exactly one teacher: teacher=client.load_model('teacher.py') "
                "(a stored model, sent as teacher_model_id) or teacher=<a torch.nn.Module> for an "
                "in-process run"
            )
        if self.teacher_checkpoint_id is not None and self.teacher_checkpoint_path is not None:
            raise ValueError(
                "teacher_checkpoint: give a stored checkpoint id or a local file, not both"
            )
        if self.teacher_module is not None and self.teacher_model_kwargs:
            raise ValueError(
                "teacher_model_kwargs build a teacher from its model file; a live teacher "
                "module is already built: remove them"
            )
        if self.feature_loss_weight is not None and not self.feature_layers:
            raise ValueError(
                "feature_loss_weight needs feature_layers (student module -> teacher module, "
                "e.g. {'3': '5'}) whose outputs the feature loss compares"
            )
        if self.feature_layers and self.feature_weight == 0:
            raise ValueError(
                "feature_layers with feature_loss_weight=0 would be ignored: give the feature "
                "loss a weight > 0 or remove feature_layers"
            )
        if self.alpha == 0 and not self.feature_layers and self.attention_loss_weight == 0:
            raise ValueError(
                "alpha=0 with no feature or attention loss leaves nothing of the teacher in the "
                "loss: raise alpha, or set feature_layers or attention_loss_weight"
            )
        return self

    @model_serializer(mode="wrap")
    def _wire(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        if info.mode_is_json():
            for name in LOCAL_ONLY_FIELDS:
                data.pop(name, None)
        return data

    @property
    def feature_weight(self) -> float:
        """The feature loss's weight in the total (0 without feature_layers)."""
        if not self.feature_layers:
            return 0.0
        return 0.1 if self.feature_loss_weight is None else self.feature_loss_weight

    @property
    def teacher(self) -> Any:
        """The live teacher module, or the stored teacher model's id."""
        return self.teacher_module if self.teacher_module is not None else self.teacher_model_id

    def local_only_parts(self) -> list[str]:
        """What cannot travel to a remote job: a live module (a local weights file is uploaded
        by the SDK, as ``init_from``'s is)."""
        parts = []
        if self.teacher_module is not None:
            parts.append(
                "teacher is a live torch.nn.Module, which only an in-process run can use: pass "
                "client.load_model('teacher.py') (a model file that builds it) for a remote job"
            )
        return parts


class DistillationFields(BaseModel):
    """``distillation``: a mixin of :class:`~ace3.config.training.TrainingConfig`."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    distillation: DistillationConfig | None = Field(
        None, description="Knowledge distillation from a teacher model (None: off)."
    )
