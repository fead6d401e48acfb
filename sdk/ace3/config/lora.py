"""LoRA settings of :class:`~ace3.config.training.TrainingConfig` (``lora=ace3.LoRAConfig(...)``):
low-rank adapters trained on named layers of the model while every base weight stays frozen.
Kept apart so that the training schema stays readable; ``TrainingConfig`` inherits
:class:`LoRAFields`. What the engine does with them: :mod:`ace3.runtime.techniques.lora`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

if TYPE_CHECKING:
    from ace3.config.training import TrainingConfig
    from ace3.config.unsupported import ConfigProblem

MAX_TARGETS = 256

ModulePattern = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)
]


class LoRAConfig(BaseModel):
    """Low-rank adaptation (LoRA, with Hugging Face's ``peft``) of the layers that
    ``target_modules`` names: each adapted layer ``W`` computes ``W x + (lora_alpha / r) B A x``
    with ``A`` (r x in) and ``B`` (out x r) trained and ``W`` frozen.

    ``target_modules``: module names or fnmatch patterns; an entry matches a module when it is
    its full name (``"encoder.0.fc1"``), its last components (``"fc1"`` matches every
    ``*.fc1``) or a pattern over its full name (``"layers.*.attn.q_proj"``). Matching modules
    of a type LoRA adapts (``nn.Linear``, ``nn.Embedding``, ``nn.Conv1d/2d/3d``) get adapters;
    an entry that matches none of them is refused when the job builds its model, with the
    model's module names. ``bias``: ``"none"`` (every bias frozen), ``"all"`` (every bias of
    the model trains), ``"lora_only"`` (the biases of the adapted layers train)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    r: int = Field(8, ge=1, le=4096, description="The adapters' rank.")
    lora_alpha: float = Field(
        16.0, gt=0.0, le=1e6, allow_inf_nan=False, description="Scaling: updates x alpha / r."
    )
    lora_dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the adapters' input while training."
    )
    target_modules: list[ModulePattern] = Field(
        min_length=1,
        max_length=MAX_TARGETS,
        description="Module names or fnmatch patterns of the layers to adapt (e.g. ['fc1']).",
    )
    bias: Literal["none", "all", "lora_only"] = Field(
        "none", description="Which biases train: none, all, or those of the adapted layers."
    )


class LoRAFields(BaseModel):
    """``lora``: train low-rank adapters instead of the model's weights (see
    :class:`LoRAConfig`)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lora: LoRAConfig | None = Field(
        None, description="Train LoRA adapters on these layers; the base weights stay frozen."
    )


def lora_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """What a job with ``lora`` cannot run with, each with its reason (for
    :func:`ace3.config.unsupported.unsupported_settings`)."""
    from ace3.config.layout import runs_pipeline, runs_tensor_parallel
    from ace3.config.training import _OFFLOAD_FIELDS
    from ace3.config.unsupported import ConfigProblem  # (it imports this module's users)

    if config.lora is None:
        return []
    problems: list[ConfigProblem] = []

    def refuse(field: str, reason: str) -> None:
        problems.append(ConfigProblem(field=field, reason=f"{field} with lora: {reason}"))

    if config.freeze:
        refuse("freeze", "LoRA already freezes every base weight, so freeze has nothing to "
               "add: remove it (trainable=[...] names base parameters that train fully next "
               "to the adapters)")  # fmt: skip
    if runs_pipeline(config):
        refuse("pipeline_parallel_size", "not implemented: the pipeline splits the model by "
               "its layers before the adapters would be placed; use data parallelism "
               "(zero_stage 0 or 1)")  # fmt: skip
    if runs_tensor_parallel(config):
        refuse("tensor_parallel_size", "not implemented: the tensor plans shard nn.Linear "
               "layers that LoRA replaces; use data parallelism (zero_stage 0 or 1)")  # fmt: skip
    split = runs_pipeline(config) or runs_tensor_parallel(config)  # (refused above)
    if config.effective_zero_stage >= 2 and not split:
        field = (
            "zero_stage"
            if config.zero_stage >= 2
            else next(name for name in _OFFLOAD_FIELDS if getattr(config, name))
        )
        refuse(field, f"ZeRO stage {config.effective_zero_stage} (FSDP) is not implemented "
               "with LoRA: the adapters are a small share of the model, so ZeRO-1 (zero_stage="
               "1) or plain data parallelism (zero_stage=0) already hold little optimizer "
               "state")  # fmt: skip
    if config.pruning is not None:
        refuse("pruning", "not implemented: pruning would mask the frozen base weights and the "
               "adapter matrices alike, and the merged model would lose the masks; prune the "
               "merged model in a job of its own (init_from its merged_model.safetensors)")  # fmt: skip
    if config.quantization is not None:
        refuse("quantization", "not implemented: the int8 model would be made from the adapted "
               "layers, not the merged ones; quantize the merged model in a job of its own "
               "(init_from its merged_model.safetensors)")  # fmt: skip
    return problems
