"""Mixed precision: the autocast context for forward passes and the gradient scaler.

``mixed_precision=False`` or ``amp_level='O0'``: full float32, no autocast. Otherwise forward
passes run under ``torch.autocast`` with ``amp_dtype`` (``auto``: bfloat16 on CPU and on GPUs
that support it, float16 elsewhere). A dynamic ``GradScaler`` is active only for float16 on
CUDA; elsewhere the scaler is a disabled pass-through, so the training loop has one code path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ace3.config import TrainingConfig


@dataclass(frozen=True)
class Precision:
    """How forward passes are cast on this device."""

    device_type: str
    dtype: torch.dtype | None  # None: autocast off

    @property
    def enabled(self) -> bool:
        return self.dtype is not None

    @property
    def needs_scaler(self) -> bool:
        return self.dtype == torch.float16 and self.device_type == "cuda"

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            yield

    def make_scaler(self) -> torch.amp.GradScaler:
        device = "cuda" if self.device_type == "cuda" else "cpu"
        return torch.amp.GradScaler(device, enabled=self.needs_scaler)

    def describe(self) -> str:
        return "float32" if self.dtype is None else f"autocast {str(self.dtype).split('.')[-1]}"


def resolve_precision(config: TrainingConfig, device: torch.device) -> Precision:
    """Pick the autocast dtype for ``device`` from the config."""
    if not config.mixed_precision or config.amp_level == "O0":
        return Precision(device.type, None)
    if config.amp_dtype == "float16":
        dtype = torch.float16
    elif config.amp_dtype == "bfloat16":
        dtype = torch.bfloat16
    elif device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        dtype = torch.bfloat16
    return Precision(device.type, dtype)
