"""The end of a LoRA run (:mod:`ace3.runtime.techniques.lora`): the merged model, and the figures of the
summary.

:func:`merged_state_dict` turns the adapted model into plain weights under the original module
names: every base tensor (``fc1.base_layer.weight`` -> ``fc1.weight``) as float32 (the
full-precision values the checkpoints hold, whatever the precision level), and each adapted
layer's weight plus its adapters' update, computed by peft (``get_delta_weight``) on a float32
copy of that one layer. :class:`LoRAExtension` (a loop extension) adds ``trainable_parameters`` and
``total_parameters`` to the summary and, for a job, has rank 0 write
``output_dir/artifacts/merged_model.safetensors`` at the end (the worker syncs it as an
artifact). In-process runs write no file: the caller's module gets the merged weights
(:func:`ace3.runtime.techniques.lora.remove_adapters`, called by
:func:`ace3.runtime.in_process.train_in_process`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.loop.precision import Precision
from ace3.runtime.loop.view import LoopView
from ace3.runtime.techniques.lora import ADAPTER, LoRAAdapters

MERGED_MODEL = "merged_model.safetensors"  # under output_dir/artifacts


def _layer_of(key: str, layers: dict[str, nn.Module]) -> str | None:
    """The adapted layer ``key`` belongs to (None for the model's other tensors)."""
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        if name in layers:
            return name
    return None


@torch.no_grad()
def _update(layer: nn.Module, state: dict[str, Any]) -> torch.Tensor:
    """``lora_alpha / r * B @ A`` of one layer (shaped like its weight), in float32: peft's
    own computation on a float32 copy of the layer loaded with ``state`` (its tensors)."""
    clone = copy.deepcopy(layer).to(device="cpu", dtype=torch.float32)
    clone.load_state_dict({key: value.to("cpu", torch.float32) for key, value in state.items()})
    return clone.get_delta_weight(ADAPTER)


def merged_state_dict(adapters: LoRAAdapters, precision: Precision) -> dict[str, torch.Tensor]:
    """The adapted model as plain weights (float32 on the CPU, original names); see the
    module docstring."""
    with adapters.whole_state():
        state = precision.model_state_dict(adapters.model)
    merged: dict[str, torch.Tensor] = {}
    per_layer: dict[str, dict[str, Any]] = {name: {} for name in adapters.layers}
    for key, value in state.items():
        layer = _layer_of(key, adapters.layers)
        if layer is None:
            merged[key] = value
            continue
        local = key[len(layer) + 1 :]
        per_layer[layer][local] = value
        if local.startswith("base_layer."):
            merged[f"{layer}.{local[len('base_layer.') :]}"] = value
    for name, layer in adapters.layers.items():
        weight = merged[f"{name}.weight"].to("cpu", torch.float32)
        merged[f"{name}.weight"] = weight + _update(layer, per_layer[name])
    return {
        key: value.detach().to("cpu").clone().contiguous()
        for key, value in merged.items()
        if isinstance(value, torch.Tensor)
    }


class LoRAExtension(LoopExtension):
    """The summary's parameter counts; the merged model as an artifact of a job (rank 0)."""

    def __init__(self, adapters: LoRAAdapters, precision: Precision, write_merged: bool) -> None:
        self.adapters, self.precision, self.write_merged = adapters, precision, write_merged

    def finish(self, loop: LoopView) -> dict[str, Any]:
        if self.write_merged and loop.ctx.is_main:
            from ace3.training.checkpoints import save_checkpoint

            path = loop.place.output_dir / "artifacts" / MERGED_MODEL
            path.parent.mkdir(parents=True, exist_ok=True)
            state = merged_state_dict(self.adapters, self.precision)
            save_checkpoint(state, path)
            size = path.stat().st_size
            loop.log(
                f"merged model (base + LoRA adapters, {len(state)} tensors, {size:,} bytes) "
                f"written to artifacts/{MERGED_MODEL}"
            )
        return self.adapters.summary()
