"""The ``autocast`` context and the rule that picks its 16-bit dtype (``amp_dtype="auto"``)."""

from __future__ import annotations

import torch

__all__ = ["autocast", "resolve_amp_dtype"]

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def _default_device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _cuda_has_native_bf16() -> bool:
    """bfloat16 in hardware (Ampere and newer); emulated bfloat16 on older GPUs is slow."""
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch before 2.3 has no including_emulation and never emulates
        return bool(torch.cuda.is_bf16_supported())


def resolve_amp_dtype(
    choice: str | torch.dtype | None = "auto", device_type: str | None = None
) -> torch.dtype:
    """The 16-bit dtype for ``choice`` on ``device_type`` (the config's ``amp_dtype`` rule).

    ``"auto"`` (or None): bfloat16 on CPU and on CUDA GPUs that support it (Ampere and newer),
    float16 on older GPUs and other devices. ``"float16"``/``"bfloat16"`` (or the torch dtypes)
    are taken as given.
    """
    device_type = device_type or _default_device_type()
    if choice is None or choice == "auto":
        if device_type == "cpu":
            return torch.bfloat16
        if device_type == "cuda":
            return torch.bfloat16 if _cuda_has_native_bf16() else torch.float16
        return torch.float16
    if isinstance(choice, torch.dtype):
        if choice in (torch.float16, torch.bfloat16):
            return choice
        raise ValueError(
            f"dtype={choice} is not a 16-bit autocast type: use torch.float16 or torch.bfloat16"
        )
    if isinstance(choice, str) and choice.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[choice.lower()]
    raise ValueError(
        f"dtype={choice!r} is not a 16-bit autocast type: use 'auto', 'float16' or 'bfloat16' "
        "(or torch.float16 / torch.bfloat16)"
    )


def autocast(
    enabled: bool = True,
    dtype: str | torch.dtype | None = None,
    device_type: str | None = None,
) -> torch.autocast:
    """A ``torch.autocast`` context (also usable as a decorator) with ACE3's defaults.

    ``device_type`` defaults to ``"cuda"`` when CUDA is available, else ``"cpu"``; ``dtype``
    defaults to bfloat16 on CPU and on GPUs that support it, float16 otherwise (the rule of
    ``TrainingConfig(amp_dtype="auto")``). ``enabled=False`` runs the block in full precision.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {enabled!r}")
    if device_type is None:
        device_type = _default_device_type()
    elif not isinstance(device_type, str) or not device_type:
        raise ValueError(
            f"device_type must be a device name such as 'cuda' or 'cpu', got {device_type!r}"
        )
    if enabled and device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device_type='cuda' but CUDA is not available in this process: use "
            "device_type='cpu' or leave device_type unset"
        )
    return torch.autocast(
        device_type=device_type, dtype=resolve_amp_dtype(dtype, device_type), enabled=enabled
    )
