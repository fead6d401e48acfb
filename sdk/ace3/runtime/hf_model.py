"""Hugging Face model directories (``model.kind='huggingface'``): the model is built in the job's
sandbox, and only there, with ``AutoModelForCausalLM.from_pretrained`` on the worker's local
copy of the stored directory (safetensors weights only, no download; the directory's own
modelling code, named by ``auto_map`` in its ``config.json``, runs here and nowhere else).
``model_kwargs`` are passed to ``from_pretrained`` (``attn_implementation="eager"``, ...); the
weights load as float32 unless they name another ``dtype``. What a job writes at its end:
:mod:`ace3.runtime.hf_export`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

FACTORY = "from_pretrained"


def read_model_config(directory: Path, name: str = "config.json") -> dict[str, Any]:
    """The directory's ``config.json`` (or another JSON file of it) as a dict; ValueError saying
    why it cannot be read."""
    path = directory / name
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"the model directory's {name} cannot be read: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError(f"the model directory's {name} is not a JSON object")
    return config


def pretrained_factory(directory: Path) -> Callable[..., nn.Module]:
    """``from_pretrained(**model_kwargs)`` for the model in ``directory``."""
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"the Hugging Face model directory {directory} has no config.json")
    custom_code = "auto_map" in read_model_config(directory)

    def from_pretrained(**kwargs: Any) -> nn.Module:
        from transformers import AutoModelForCausalLM

        options: dict[str, Any] = {"dtype": torch.float32, **kwargs}
        model: nn.Module = AutoModelForCausalLM.from_pretrained(
            str(directory),
            local_files_only=True,
            use_safetensors=True,
            trust_remote_code=custom_code,
            **options,
        )
        # No key/value cache while training: it costs memory for nothing, and without it (and
        # without an attention mask) transformers keeps the examples of a packed sequence apart
        # by their restarting position ids (ace3.runtime.data.text_datasets).
        if hasattr(model, "config") and hasattr(model.config, "use_cache"):
            model.config.use_cache = False
        return model

    return from_pretrained
