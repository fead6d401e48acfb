"""``init_from``: start training from the model weights of a checkpoint (fine-tuning).

Not a resume: only the model's weights are taken; the optimizer, the schedule and the step
start fresh. Applied on every rank to the model the user code built, before freezing, adapters
and the parallelism strategy, so every strategy starts from the same weights. Read without
running pickled code: an ACE3 checkpoint (``.pt``, its ``model`` entry), a plain state dict
saved with ``torch.save``, a ``.safetensors`` file, or a sharded ``.dcp.tar`` (a ZeRO job's
checkpoint, consolidated: its DCP metadata, torch's pickle, is read by
:mod:`ace3.runtime.checkpoint.dcp_reading`, which runs none of it). The names and shapes must
match the model exactly.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ace3.files import sha256_file
from ace3.runtime.checkpoint.archive import is_sharded_archive

SHARDED_SUFFIX = ".dcp.tar"


def read_weights(
    path: Path,
    expected_sha256: str | None = None,
    *,
    what: str = "init_from",
) -> dict[str, torch.Tensor]:
    """The model state dict held by the file at ``path`` (see the module docstring); errors
    start with ``what`` (the setting that named the file)."""
    if not path.is_file():
        raise FileNotFoundError(f"{what}: no checkpoint file at {path}")
    if expected_sha256 is not None and sha256_file(path).lower() != expected_sha256.lower():
        raise ValueError(f"{what}: {path} is not the expected file (sha256 differs)")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return dict(load_file(str(path), device="cpu"))
    if path.name.endswith(SHARDED_SUFFIX) or is_sharded_archive(path):
        from ace3.runtime.checkpoint.sharded import consolidate

        state: object = consolidate(path)
    else:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise ValueError(
                f"{what}: {path.name} is not a checkpoint that loads without running code "
                f"(torch.load(weights_only=True) refused it: {exc})"
            ) from None
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]  # an ACE3 training checkpoint
    if not isinstance(state, dict) or not state:
        raise ValueError(f"{what}: {path.name} holds no state dict of tensors")
    weights = {}
    for name, value in state.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise ValueError(
                f"{what}: {path.name} is not a state dict (entry {name!r} is "
                f"{type(value).__name__}, not a tensor)"
            )
        weights[name] = value
    return weights


def _listed(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def load_initial_weights(model: nn.Module, weights: dict[str, torch.Tensor], label: str) -> str:
    """Copy ``weights`` into ``model`` (every entry, nothing missing or extra, same shapes);
    return the log line. ValueError naming the mismatches otherwise."""
    expected = model.state_dict()
    missing = [name for name in expected if name not in weights]
    unexpected = [name for name in weights if name not in expected]
    wrong_shape = [
        f"{name} {tuple(weights[name].shape)} vs the model's {tuple(value.shape)}"
        for name, value in expected.items()
        if name in weights and weights[name].shape != value.shape
    ]
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint: {_listed(missing)}")
    if unexpected:
        problems.append(f"not in the model: {_listed(unexpected)}")
    if wrong_shape:
        problems.append(f"shapes differ: {_listed(wrong_shape, 4)}")
    if problems:
        lora = (
            ". It is a LoRA job's checkpoint, which holds the adapters alone: start from that "
            "job's merged model (its artifact merged_model.safetensors) instead"
            if any(".lora_" in name for name in unexpected)
            else ""
        )
        raise ValueError(
            f"init_from: the weights of {label} do not fit the model ({'; '.join(problems)}): "
            f"start from a checkpoint of the same architecture (same model file and kwargs){lora}"
        )
    with torch.no_grad():
        for name, value in expected.items():
            value.copy_(weights[name].to(dtype=value.dtype))
    elements = sum(value.numel() for value in weights.values())
    return (
        f"initialised from {label}: {len(weights)} tensors ({elements:,} elements); "
        "a fresh optimizer and schedule from step 0"
    )
