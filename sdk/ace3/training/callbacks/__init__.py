"""Callbacks: code that runs inside the training loop at fixed points (Keras-style).

Subclass :class:`Callback` and override any of its ``on_*`` methods, or use a built-in one:
:class:`EarlyStopping`, :class:`ModelCheckpoint`, :class:`ReduceLROnPlateau`::

    early_stopping = ace3.callbacks.EarlyStopping(monitor="val_loss", patience=5)
    trainer = ace3.Trainer(callbacks=[early_stopping])

Where they run: in a local run, the very objects you pass; in a remote job, copies rebuilt by
the engine inside every rank (see :mod:`ace3.training.callbacks.transport` for what can be carried).
Callbacks run on every rank with the same arguments, so every rank takes the same decisions;
what they print appears once (only rank 0's output is kept).

The package: :mod:`.base` (``Callback``, ``CallbackError``), :mod:`.monitor` and :mod:`.checks`
(what the built-ins share), one module per built-in, :mod:`.registry` (the built-ins by name),
and the transport to a remote job (:mod:`.transport`, :mod:`.source_collector`,
:mod:`.values`), which this ``__init__`` does not import. This package does not import torch (the engine calls the callbacks with torch objects).
"""

from ace3.training.callbacks.base import Callback, CallbackError
from ace3.training.callbacks.base import Mode as Mode
from ace3.training.callbacks.early_stopping import EarlyStopping
from ace3.training.callbacks.model_checkpoint import ModelCheckpoint
from ace3.training.callbacks.monitor import resolve_mode
from ace3.training.callbacks.reduce_lr_on_plateau import ReduceLROnPlateau
from ace3.training.callbacks.registry import BUILTIN_CALLBACKS, init_params

__all__ = [
    "BUILTIN_CALLBACKS",
    "Callback",
    "CallbackError",
    "EarlyStopping",
    "ModelCheckpoint",
    "ReduceLROnPlateau",
    "init_params",
    "resolve_mode",
]

# This package is the public home of these names, as when it was one module: the source that
# carries a callback to a job imports them from here (``from ace3.training.callbacks import
# EarlyStopping``), and their reprs and pickles name it.
for _public in (
    Callback,
    CallbackError,
    EarlyStopping,
    ModelCheckpoint,
    ReduceLROnPlateau,
    init_params,
    resolve_mode,
):
    _public.__module__ = __name__
del _public
