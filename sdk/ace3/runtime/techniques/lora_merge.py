"""The end of a LoRA run (:mod:`ace3.runtime.techniques.lora`): the merged model, and the figures of the
summary.

:func:`merge_weights` turns the adapted model's whole state (:func:`whole_weights`: on rank 0,
gathered from every rank where ZeRO-2/3 sharded it) into plain weights under the original
module names: every base tensor (``fc1.base_layer.weight`` -> ``fc1.weight``) as float32 (the
full-precision values the checkpoints hold, whatever the precision level), and each adapted
layer's weight plus its adapters' update, computed by peft (``get_delta_weight``) on a float32
CPU copy of that one layer (made from the layer's structure, copied onto the meta device before
any sharding). :class:`LoRAExtension` (a loop extension) adds ``trainable_parameters`` and
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
from ace3.runtime.parallel.sharding import rank0_float32_state
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
def _update(template: nn.Module, state: dict[str, Any]) -> torch.Tensor:
    """``lora_alpha / r * B @ A`` of one layer (shaped like its weight), in float32: peft's
    own computation on a float32 CPU copy of the layer (``template``: its structure on the meta
    device) given ``state`` (its tensors)."""
    clone = copy.deepcopy(template).to_empty(device="cpu").to(torch.float32)
    clone.load_state_dict({key: value.to("cpu", torch.float32) for key, value in state.items()})
    return clone.get_delta_weight(ADAPTER)


def whole_weights(adapters: LoRAAdapters, precision: Precision, is_main: bool) -> dict[str, Any]:
    """The adapted model's whole state (base weights and adapters, float32 on the CPU) on rank
    0, an empty dict elsewhere: gathered where a strategy sharded it (a collective then: every
    rank calls this)."""
    with adapters.whole_state():
        return rank0_float32_state(adapters.model, precision, is_main)


def merge_weights(adapters: LoRAAdapters, whole: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The merged model (original names, float32 on the CPU) from :func:`whole_weights`: the
    adapted layers' weights are new tensors, every other tensor is ``whole``'s own."""
    merged: dict[str, Any] = {}
    per_layer: dict[str, dict[str, Any]] = {name: {} for name in adapters.layers}
    for key, value in whole.items():
        layer = _layer_of(key, adapters.layers)
        if layer is None:
            merged[key] = value
            continue
        local = key[len(layer) + 1 :]
        per_layer[layer][local] = value
        if local.startswith("base_layer."):
            merged[f"{layer}.{local[len('base_layer.') :]}"] = value
    for name in adapters.layers:
        weight = merged[f"{name}.weight"].to("cpu", torch.float32)
        update = _update(adapters.templates[name], per_layer[name])
        merged[f"{name}.weight"] = (weight + update).detach().contiguous()
    # The other tensors are whole's own (float32 CPU copies, one per key): not copied again.
    return {key: value for key, value in merged.items() if isinstance(value, torch.Tensor)}


def merged_state_dict(adapters: LoRAAdapters, precision: Precision) -> dict[str, torch.Tensor]:
    """The adapted model as plain weights (float32 on the CPU, original names) of a model
    that is not sharded; see the module docstring."""
    return merge_weights(adapters, whole_weights(adapters, precision, is_main=True))


class LoRAExtension(LoopExtension):
    """The summary's parameter counts; the merged model as an artifact of a job (rank 0)."""

    def __init__(self, adapters: LoRAAdapters, precision: Precision, write_merged: bool) -> None:
        self.adapters, self.precision, self.write_merged = adapters, precision, write_merged

    def finish(self, loop: LoopView) -> dict[str, Any]:
        if not self.write_merged:
            return self.adapters.summary()
        whole = whole_weights(self.adapters, self.precision, loop.ctx.is_main)  # every rank
        if loop.ctx.is_main:
            from ace3.training.checkpoints import save_checkpoint

            path = loop.place.output_dir / "artifacts" / MERGED_MODEL
            path.parent.mkdir(parents=True, exist_ok=True)
            state = merge_weights(self.adapters, whole)
            del whole  # the adapted layers' base weights (state shares the rest)
            save_checkpoint(state, path)
            size = path.stat().st_size
            loop.log(
                f"merged model (base + LoRA adapters, {len(state)} tensors, {size:,} bytes) "
                f"written to artifacts/{MERGED_MODEL}"
            )
        return self.adapters.summary()
