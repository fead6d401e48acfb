"""What a job on a stored Hugging Face model directory is refused at submission:

- a parallel layout that splits the model by a model file's plan (tensor or pipeline
  parallelism: a model directory has no ``tensor_parallel_plan`` or ``pipeline_stages``);
- an export (``artifacts/huggingface/``, float32) that cannot fit the job's artifacts
  (``ACE3_MAX_ARTIFACT_BYTES``): its files would not be synced;
- ``eval_prompts`` on a model that is not a Hugging Face model directory (generation needs its
  tokenizer and ``generate``);
- LoRA targets that match no module. The model's module names are known: the directory records
  them (the tensor names of its safetensors headers less
their last component, ``models.module_names``). An entry of ``lora.target_modules`` that matches
no module at all (by the engine's rule, :func:`ace3.runtime.techniques.lora.select_targets`:
the full name, its last components, or an fnmatch pattern over the full name) is certain to
fail the job at build; whether a matching module is a layer LoRA adapts is left to the build,
which knows the layer types."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

from ace3.config import runs_pipeline, runs_tensor_parallel

SHOWN_KINDS = 16  # distinct last components named in a refusal


def _matches(name: str, pattern: str) -> bool:
    return fnmatchcase(name, pattern) or fnmatchcase(name, "*." + pattern)


def _kinds(names: Sequence[str]) -> str:
    """The distinct last components of the module names (``c_attn``, ``q_proj``, ...)."""
    kinds = sorted({name.rpartition(".")[2] for name in names})
    shown = ", ".join(kinds[:SHOWN_KINDS])
    return shown + (f", ... ({len(kinds)} in all)" if len(kinds) > SHOWN_KINDS else "")


def lora_target_problems(model: Any, config: Any, loc: list[str | int]) -> list[dict[str, Any]]:
    """One 422 entry per ``lora.target_modules`` entry that matches no module of ``model`` (its
    stored row), where the row records its module names."""
    lora = getattr(config, "lora", None)
    names = getattr(model, "module_names", None) if model is not None else None
    if lora is None or not names or lora.target_modules == "all-linear":
        return []
    problems = []
    for index, pattern in enumerate(lora.target_modules):
        if not any(_matches(name, pattern) for name in names):
            problems.append(
                {
                    "loc": [*loc, "lora", "target_modules", index],
                    "msg": f"{pattern!r} matches no module of model {model.name!r}; the last "
                    f"parts of its module names: {_kinds(names)} (or 'all-linear')",
                    "type": "value_error",
                }
            )
    return problems


FLOAT32_BYTES = 4


def hf_layout_problems(
    model: Any, config: Any, loc: list[str | int], max_artifact_bytes: int | None
) -> list[dict[str, Any]]:
    """Tensor or pipeline parallelism, and an export larger than the job's artifacts may be,
    for a Hugging Face model directory (see the module docstring)."""
    if model is None or model.kind != "huggingface":
        return []
    problems = []
    split = [
        (field, what)
        for field, what, runs in (
            ("tensor_parallel_size", "tensor", runs_tensor_parallel(config)),
            ("pipeline_parallel_size", "pipeline", runs_pipeline(config)),
        )
        if runs
    ]
    for field, what in split:
        problems.append(
            {
                "loc": [*loc, field],
                "msg": f"{what} parallelism splits a model by its model file's plan, which a "
                "Hugging Face model directory has none of: use data parallelism or ZeRO "
                "(zero_stage 1 to 3) to spread it",
                "type": "value_error",
            }
        )
    count = getattr(model, "parameter_count", None)
    if max_artifact_bytes is not None and count and count * FLOAT32_BYTES > max_artifact_bytes:
        problems.append(
            {
                "loc": ["body", "model_id"],
                "msg": f"the trained model is exported as float32 safetensors, about "
                f"{count * FLOAT32_BYTES:,} bytes for its {count:,} parameters, more than "
                f"the {max_artifact_bytes:,} bytes of artifacts a job may store "
                "(ACE3_MAX_ARTIFACT_BYTES): an administrator raises it for models of this size",
                "type": "value_error",
            }
        )
    return problems


def eval_prompt_problems(model: Any, config: Any, loc: list[str | int]) -> list[dict[str, Any]]:
    """``eval_prompts`` asks a model that is not a Hugging Face model directory to generate."""
    if model is None or not getattr(config, "eval_prompts", None) or model.kind == "huggingface":
        return []
    return [
        {
            "loc": [*loc, "eval_prompts"],
            "msg": f"eval_prompts needs a Hugging Face model directory (kind 'huggingface', "
            f"with its tokenizer); model {model.name!r} is of kind {model.kind!r}: remove "
            "eval_prompts, or upload the model as a Hugging Face directory",
            "type": "value_error",
        }
    ]
