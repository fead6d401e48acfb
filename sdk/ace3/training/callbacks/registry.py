"""The built-in callbacks by name, and a built-in's init arguments (how a spec carries one)."""

from __future__ import annotations

import inspect
from typing import Any

from ace3.training.callbacks.base import Callback
from ace3.training.callbacks.early_stopping import EarlyStopping
from ace3.training.callbacks.model_checkpoint import ModelCheckpoint
from ace3.training.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau

__all__ = ["BUILTIN_CALLBACKS", "init_params"]


BUILTIN_CALLBACKS: dict[str, type[Callback]] = {
    "EarlyStopping": EarlyStopping,
    "ModelCheckpoint": ModelCheckpoint,
    "ReduceLROnPlateau": ReduceLROnPlateau,
}


def init_params(callback: Callback) -> dict[str, Any]:
    """A built-in callback's init arguments (each stored under its own name)."""
    signature = inspect.signature(type(callback).__init__)
    return {
        name: getattr(callback, name)
        for name, parameter in signature.parameters.items()
        if name != "self" and parameter.kind is parameter.POSITIONAL_OR_KEYWORD
    }
