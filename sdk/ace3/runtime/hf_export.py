"""What a job on a Hugging Face model (:mod:`ace3.runtime.hf_model`) writes at its end: rank 0
writes, under ``output_dir/artifacts``:

- ``huggingface/``: the trained model as people deploy it, loadable as is by
  ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``: the source's
  ``config.json`` (its ``dtype`` set to float32, the weights' type), safetensors weights (sharded
  past :data:`MAX_SHARD_SIZE`, with an index), and the source's tokenizer and generation files;
  with LoRA the adapters merged into the weights;
- with LoRA also ``adapter/``: the adapters in peft's own format (``adapter_config.json``,
  ``adapter_model.safetensors``), for ``PeftModel.from_pretrained(base, "adapter")``.

Weights a strategy sharded (DTensors) are gathered onto rank 0 alone; unsharded weights are read
from rank 0's own copy (no other rank copies the model). Each directory is written beside its
place and renamed into it, so a killed attempt leaves no half export; a failure to write it
fails the job saying that training finished.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ace3.runtime.hf_model import read_model_config
from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.loop.precision import Precision
from ace3.runtime.loop.view import LoopView
from ace3.runtime.parallel.sharding import rank0_float32_state
from ace3.runtime.techniques.lora import ADAPTER, LoRAAdapters
from ace3.runtime.techniques.lora_merge import merge_weights, whole_weights

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


def _adapter_state(adapters: LoRAAdapters, whole: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The adapters (and the biases that trained) under peft's saved names: the adapter name
    left out (``base_model.model.<layer>.lora_A.weight``), an adapted layer's bias under its
    ``base_layer``; from ``whole`` (:func:`~ace3.runtime.techniques.lora_merge.whole_weights`:
    the full-precision values, the masters under O2)."""
    lora = adapters.config.lora
    assert lora is not None
    trained_biases = {
        name
        for name, param in adapters.model.named_parameters()
        if name.endswith("bias") and param.requires_grad and lora.bias != "none"
    }
    return {
        "base_model.model." + key.replace(f".{ADAPTER}.", "."): value
        for key, value in whole.items()
        if ".lora_" in key or key in trained_biases
    }


def write_adapter(
    adapters: LoRAAdapters, adapter_state: dict[str, torch.Tensor], target: Path
) -> None:
    """``adapter/`` in peft's format (see the module docstring), ``adapter_state`` from
    :func:`_adapter_state`."""
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
    save_file(adapter_state, str(target / "adapter_model.safetensors"))


def write_model_directory(state: dict[str, torch.Tensor], source: Path, target: Path) -> None:
    """``huggingface/``: config, weights (safetensors, sharded with an index past
    :data:`MAX_SHARD_SIZE`), the companion files of ``source``, and, for a model with its own
    code (``auto_map``), the source's top-level ``.py`` files."""
    from huggingface_hub import save_torch_state_dict

    target.mkdir(parents=True, exist_ok=True)
    config = read_model_config(source)
    config["dtype"] = "float32"
    config.pop("torch_dtype", None)
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_torch_state_dict(state, str(target), max_shard_size=MAX_SHARD_SIZE)
    names = list(COMPANION_FILES)
    if "auto_map" in config:
        names += [p.name for p in source.glob("*.py")]
    for name in names:
        if (source / name).is_file() and not (source / name).is_symlink():
            shutil.copyfile(source / name, target / name)


def drop_tied_output(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Leave the output embedding out of ``state`` when the model ties it to the input one
    (``tie_word_embeddings``: GPT-2's ``lm_head`` is ``wte``) and the two are equal: loading
    ties them again, and the weights are not written twice."""
    config = getattr(model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return
    get_input = getattr(model, "get_input_embeddings", None)
    get_output = getattr(model, "get_output_embeddings", None)
    if not (callable(get_input) and callable(get_output)):
        return
    modules = {id(module): name for name, module in model.named_modules()}
    inputs, outputs = get_input(), get_output()
    if inputs is None or outputs is None or id(outputs) not in modules:
        return
    input_key = f"{modules.get(id(inputs))}.weight"
    output_key = f"{modules[id(outputs)]}.weight"
    both = input_key in state and output_key in state and input_key != output_key
    if both and torch.equal(state[input_key], state[output_key]):
        del state[output_key]


def _in_place(write: Callable[[Path], None], target: Path) -> None:
    """Write a directory whole beside ``target`` (a hidden ``.<name>.tmp-<pid>`` that the
    artifact sync skips) and rename it into place: a killed attempt never leaves half an
    export that looks finished."""
    scratch = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    write(scratch)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(scratch, target)


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
        try:
            self._export(loop)
        except Exception as exc:
            raise RuntimeError(
                f"training finished and its checkpoints are saved, but writing the Hugging Face "
                f"model to artifacts/{EXPORT_DIR}/ failed: {type(exc).__name__}: {exc}"
            ) from exc
        return {}

    def _export(self, loop: LoopView) -> None:
        is_main = loop.ctx.is_main
        adapters = self.adapters
        adapter_state: dict[str, torch.Tensor] = {}
        # (every rank: gathered onto rank 0 where ZeRO-2/3 sharded the model)
        if adapters is not None:
            whole = whole_weights(adapters, self.precision, is_main)
            state = merge_weights(adapters, whole) if is_main else {}
            if is_main and not adapters.config.trainable:
                adapter_state = _adapter_state(adapters, whole)
            del whole  # the adapted layers' base weights go: state has them merged
        else:
            state = rank0_float32_state(self.model, self.precision, is_main)
        if not is_main:
            return
        drop_tied_output(self.model, state)
        artifacts = loop.place.output_dir / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        _in_place(lambda at: write_model_directory(state, self.source, at), artifacts / EXPORT_DIR)
        written = f"artifacts/{EXPORT_DIR}/"
        if adapters is not None and adapters.config.trainable:
            loop.log(
                f"no artifacts/{ADAPTER_DIR}/: the parameters trainable= names trained fully, "
                f"beside the adapters, and live only in artifacts/{EXPORT_DIR}/"
            )
        elif adapters is not None:
            _in_place(
                lambda at: write_adapter(adapters, adapter_state, at), artifacts / ADAPTER_DIR
            )
            written += f" and artifacts/{ADAPTER_DIR}/ (peft)"
        size = sum(p.stat().st_size for p in (artifacts / EXPORT_DIR).iterdir())
        loop.log(f"Hugging Face model ({len(state)} tensors, {size:,} bytes) written to {written}")
