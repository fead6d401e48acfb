"""``ace3.save_checkpoint`` / ``ace3.load_checkpoint``: checkpoint files you manage yourself.

Saving is atomic (a temporary file in the same directory, fsync, rename): a crash never leaves
a half-written checkpoint under the final name. Loading never executes pickled code: ``.pt``
files are read with ``torch.load(weights_only=True)`` (tensors, numbers, strings, lists,
dicts...), ``.safetensors`` files with safetensors (a flat dict of tensors). A sharded
training checkpoint (``step-*.dcp.tar``, from a ZeRO job) is consolidated into one state
(full weights and optimizer state): its members must be plain files, its
torch.distributed.checkpoint metadata (torch's own pickle) is unpickled with only the classes
DCP metadata is made of and must read nothing outside the archive, and its other values are
read weights-only (:mod:`ace3.runtime.checkpoint.dcp_reading`). A file that would need
arbitrary unpickling, or an archive that reaches outside itself, is refused with
:class:`~ace3.errors.UnsafeCheckpointError` (a ValueError) saying what it holds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ace3.errors import UnsafeCheckpointError
from ace3.files import atomic_path

SAFETENSORS_SUFFIX = ".safetensors"


def save_checkpoint(checkpoint: Any, path: str | os.PathLike[str]) -> Path:
    """Write ``checkpoint`` (typically a dict of state dicts and numbers) to ``path``
    atomically; ``.safetensors`` paths take a flat dict of tensors. Returns the path."""
    from ace3.runtime.checkpoint.files import save_atomic

    target = Path(path).expanduser()
    if target.suffix == SAFETENSORS_SUFFIX:
        return _save_safetensors(checkpoint, target)
    return save_atomic(checkpoint, target).path


def _save_safetensors(checkpoint: Any, target: Path) -> Path:
    import torch

    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ImportError(
            "saving .safetensors needs the safetensors package: pip install safetensors "
            "(or save to a .pt file)"
        ) from None
    if not isinstance(checkpoint, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in checkpoint.items()
    ):
        raise TypeError(
            "a .safetensors checkpoint must be a flat dict of str -> tensor (e.g. "
            "model.state_dict()); save nested checkpoints to a .pt file"
        )
    with atomic_path(target) as tmp:
        save_file({k: v.contiguous() for k, v in checkpoint.items()}, str(tmp))
    return target


def load_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> Any:
    """Read a checkpoint without executing pickled code (see the module docstring)."""
    import pickle

    import torch

    source = Path(path).expanduser()
    if not source.is_file():
        raise FileNotFoundError(f"checkpoint file not found: {source}")
    if source.name.endswith(".dcp.tar"):  # a sharded (ZeRO) training checkpoint
        from ace3.runtime.checkpoint.sharded import consolidate

        return consolidate(source)
    if source.suffix == SAFETENSORS_SUFFIX:
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise ImportError(
                "loading .safetensors needs the safetensors package: pip install safetensors"
            ) from None
        device = str(map_location) if map_location is not None else "cpu"
        return load_file(str(source), device=device)
    try:
        return torch.load(source, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"{source} holds Python objects that loading would have to execute (weights-only "
            f"loading refused them: {str(exc).splitlines()[0]}). Save plain tensors, numbers, "
            "strings, lists and dicts (e.g. state_dict()) instead of whole objects."
        ) from exc
