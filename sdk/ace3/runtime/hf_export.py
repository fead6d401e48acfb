"""What a job on a Hugging Face model (:mod:`ace3.runtime.hf_model`) writes at its end: rank 0
writes, under ``output_dir/artifacts``:

- ``huggingface/``: the trained model as people deploy it, loadable as is by
  ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``: the source's
  ``config.json`` (its ``dtype`` set to float32, the weights' type), safetensors weights (sharded
  past :data:`MAX_SHARD_SIZE`, with an index), and the source's tokenizer and generation files;
  with LoRA the adapters merged into the weights;
- with LoRA also ``adapter/``: the adapters in peft's own format (``adapter_config.json``,
  ``adapter_model.safetensors``), for ``PeftModel.from_pretrained(base, "adapter")``.

Weights a strategy sharded (DTensors) are gathered whole first, on every rank.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ace3.runtime.hf_model import read_model_config
from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.loop.precision import Precision
from ace3.runtime.loop.view import LoopView
from ace3.runtime.techniques.lora import ADAPTER, LoRAAdapters
from ace3.runtime.techniques.lora_merge import merged_state_dict

EXPORT_DIR = "huggingface"  # under output_dir/artifacts
ADAPTER_DIR = "adapter"
MAX_SHARD_SIZE = "2GB"
# What a deployment reads besides config.json and the weights: copied as they are.
COMPANION_FILES = (
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)


def _full_state(model: nn.Module, precision: Precision) -> dict[str, torch.Tensor]:
    """Every weight of ``model`` as float32 CPU tensors, gathered whole on every rank where a
    strategy sharded it (DTensors: a collective, so every rank calls this)."""
    state = precision.model_state_dict(model)
    whole: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        full = getattr(value, "full_tensor", None)
        tensor = full() if callable(full) else value
        whole[key] = tensor.detach().to("cpu", torch.float32).clone().contiguous()
    return whole


def _adapter_state(adapters: LoRAAdapters) -> dict[str, torch.Tensor]:
    """The adapters (and the biases that trained) under peft's saved names:
    ``base_model.model.<layer>.lora_A.weight`` (the adapter name left out)."""
    lora = adapters.config.lora
    assert lora is not None
    saved: dict[str, torch.Tensor] = {}
    for name, param in adapters.model.named_parameters():
        is_adapter = ".lora_" in name
        is_bias = name.endswith("bias") and param.requires_grad and lora.bias != "none"
        if not (is_adapter or is_bias):
            continue
        key = "base_model.model." + name.replace(f".{ADAPTER}.", ".").replace(".base_layer.", ".")
        saved[key] = param.detach().to("cpu", torch.float32).clone().contiguous()
    return saved


def write_adapter(adapters: LoRAAdapters, target: Path) -> None:
    """``adapter/`` in peft's format (see the module docstring)."""
    import peft
    from safetensors.torch import save_file

    lora = adapters.config.lora
    assert lora is not None
    target.mkdir(parents=True, exist_ok=True)
    peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.lora_alpha,
        lora_dropout=lora.lora_dropout,
        bias=lora.bias,
        target_modules=sorted(adapters.layers),
        task_type="CAUSAL_LM",
    ).save_pretrained(str(target))
    save_file(_adapter_state(adapters), str(target / "adapter_model.safetensors"))


def write_model_directory(state: dict[str, torch.Tensor], source: Path, target: Path) -> None:
    """``huggingface/``: config, weights (safetensors, sharded with an index past
    :data:`MAX_SHARD_SIZE`) and the companion files of ``source``."""
    from huggingface_hub import save_torch_state_dict

    target.mkdir(parents=True, exist_ok=True)
    config = read_model_config(source)
    config["dtype"] = "float32"
    config.pop("torch_dtype", None)
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_torch_state_dict(state, str(target), max_shard_size=MAX_SHARD_SIZE)
    for name in COMPANION_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, target / name)


class HuggingFaceExport(LoopExtension):
    """Writes ``huggingface/`` (and, with LoRA, ``adapter/``) at the end of a job (rank 0)."""

    def __init__(
        self,
        model: nn.Module,
        source: Path,
        precision: Precision,
        adapters: LoRAAdapters | None,
        split: bool = False,
    ) -> None:
        self.model, self.source, self.precision, self.adapters = model, source, precision, adapters
        self.split = split  # pipeline stages: no rank can gather the whole model here

    def finish(self, loop: LoopView) -> dict[str, Any]:
        if self.split:
            loop.log(
                f"the Hugging Face model is not written to artifacts/{EXPORT_DIR}/ from a "
                "pipeline-parallel run (each rank holds only its stages): load the final "
                "checkpoint into the model directory's model instead"
            )
            return {}
        if self.adapters is not None:  # (LoRA runs unsharded: rank 0 holds every weight)
            state = merged_state_dict(self.adapters, self.precision) if loop.ctx.is_main else {}
        else:
            state = _full_state(self.model, self.precision)
        if not loop.ctx.is_main:
            return {}
        artifacts = loop.place.output_dir / "artifacts"
        write_model_directory(state, self.source, artifacts / EXPORT_DIR)
        written = f"artifacts/{EXPORT_DIR}/"
        if self.adapters is not None:
            write_adapter(self.adapters, artifacts / ADAPTER_DIR)
            written += f" and artifacts/{ADAPTER_DIR}/ (peft)"
        size = sum(p.stat().st_size for p in (artifacts / EXPORT_DIR).iterdir())
        loop.log(f"Hugging Face model ({len(state)} tensors, {size:,} bytes) written to {written}")
        return {}
