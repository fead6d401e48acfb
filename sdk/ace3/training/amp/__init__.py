"""Mixed precision for your own loops: ``autocast`` and the loss scalers.

The document's loops run as written::

    scaler = ace3.GradientScaler(init_scale=65536.0, growth_factor=2.0,
                                 backoff_factor=0.5, growth_interval=2000)
    for batch in dataloader:
        with ace3.autocast():
            loss = model(batch)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

A loss scaler multiplies the loss before ``backward()`` so that small float16 gradients do not
underflow to zero, divides the gradients back before the optimizer sees them, and skips any
step whose gradients overflowed (inf/NaN). :class:`GradientScaler` and
:class:`DynamicLossScaler` adapt the scale (back off on overflow, grow after a window of clean
steps, always within ``[min_scale, max_scale]``); :class:`StaticLossScaler` keeps one scale.
Under ``torch.distributed`` every rank skips the same steps (the overflow flag is all-reduced).

bfloat16 has float32's exponent range and needs no scaling: :func:`make_loss_scaler` turns
scaling on for float16 only. The training engine uses these same classes.

The package is split by job: :mod:`.autocasting` (``autocast`` and its dtype),
:mod:`.loss_scaler` (the scaling machinery), :mod:`.scalers` (the public scalers and
``make_loss_scaler``), :mod:`.unscaling` (unscaling the grads, the overflow flag). It imports
torch; ``import ace3`` does not load it until one of these names is used.
"""

from ace3.training.amp.autocasting import autocast, resolve_amp_dtype
from ace3.training.amp.loss_scaler import LossScaler
from ace3.training.amp.scalers import (
    DynamicLossScaler,
    GradientScaler,
    StaticLossScaler,
    make_loss_scaler,
)

__all__ = [
    "DynamicLossScaler",
    "GradientScaler",
    "LossScaler",
    "StaticLossScaler",
    "autocast",
    "make_loss_scaler",
    "resolve_amp_dtype",
]
