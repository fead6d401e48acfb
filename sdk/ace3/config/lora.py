"""LoRA settings of :class:`~ace3.config.training.TrainingConfig` (``lora=ace3.LoRAConfig(...)``):
low-rank adapters trained on named layers of the model while every base weight stays frozen.
Kept apart so that the training schema stays readable; ``TrainingConfig`` inherits
:class:`LoRAFields`. What the engine does with them: :mod:`ace3.runtime.techniques.lora`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

MAX_TARGETS = 256

ModulePattern = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)
]
TargetPatterns = Annotated[list[ModulePattern], Field(min_length=1, max_length=MAX_TARGETS)]


class LoRAConfig(BaseModel):
    """Low-rank adaptation (LoRA, with Hugging Face's ``peft``) of the layers that
    ``target_modules`` names: each adapted layer ``W`` computes ``W x + (lora_alpha / r) B A x``
    with ``A`` (r x in) and ``B`` (out x r) trained and ``W`` frozen.

    ``target_modules``: module names or fnmatch patterns; an entry matches a module when it is
    its full name (``"encoder.0.fc1"``), its last components (``"fc1"`` matches every
    ``*.fc1``) or a pattern over its full name (``"layers.*.attn.q_proj"``). Matching modules
    of a type LoRA adapts (``nn.Linear``, ``nn.Embedding``, ``nn.Conv1d/2d/3d`` and
    ``transformers``' ``Conv1D``, GPT-2's ``c_attn``/``c_proj``/``c_fc``) get adapters; an entry
    that matches none of them is refused when the job builds its model, naming a few layers it
    could adapt. ``"all-linear"`` adapts every ``nn.Linear`` and ``Conv1D`` except the output
    layer (what ``get_output_embeddings()`` returns, a Hugging Face model's ``lm_head``; else
    the model's last such layer). ``bias``: ``"none"`` (every bias frozen), ``"all"`` (every bias of
    the model trains), ``"lora_only"`` (the biases of the adapted layers train)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    r: int = Field(8, ge=1, le=4096, description="The adapters' rank.")
    lora_alpha: float = Field(
        16.0, gt=0.0, le=1e6, allow_inf_nan=False, description="Scaling: updates x alpha / r."
    )
    lora_dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input while training."
    )
    target_modules: TargetPatterns | Literal["all-linear"] = Field(
        description="Module names or fnmatch patterns of the layers to adapt (e.g. ['fc1', "
        "'c_attn']), or 'all-linear': every nn.Linear and Conv1D except the output layer."
    )
    bias: Literal["none", "all", "lora_only"] = Field(
        "none", description="Which biases train: none, all, or those of the adapted layers."
    )

    @field_validator("target_modules", mode="before")
    @classmethod
    def _one_name_is_a_list(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "all-linear":
            raise ValueError(
                f"a list of module names or patterns, or 'all-linear'; not the string {value!r} "
                f"(write [{value!r}])"
            )
        return value


class LoRAFields(BaseModel):
    """``lora``: train low-rank adapters instead of the model's weights (see
    :class:`LoRAConfig`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lora: LoRAConfig | None = Field(
        None, description="Train LoRA adapters on these layers; the base weights stay frozen."
    )
