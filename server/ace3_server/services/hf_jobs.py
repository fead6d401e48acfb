"""LoRA targets checked at submission where the model's module names are known: a stored
Hugging Face model directory records them (the tensor names of its safetensors headers less
their last component, ``models.module_names``). An entry of ``lora.target_modules`` that matches
no module at all (by the engine's rule, :func:`ace3.runtime.techniques.lora.select_targets`:
the full name, its last components, or an fnmatch pattern over the full name) is certain to
fail the job at build; whether a matching module is a layer LoRA adapts is left to the build,
which knows the layer types."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

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
