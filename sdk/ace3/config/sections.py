"""The document's settings objects (``DistributedConfig``, ``AMPConfig``, ``CheckpointConfig``):
each converts to, or applies over, a :class:`~ace3.config.training.TrainingConfig`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ace3.config.base import _Schema
from ace3.config.checkpointing import MonitorName
from ace3.config.precision import AmpDtype, AmpLevel
from ace3.config.scale import Backend
from ace3.config.training import TrainingConfig


class DistributedConfig(_Schema):
    """The document's distributed settings; converted to a :class:`TrainingConfig` for a job."""

    num_gpus: int = Field(1, ge=1, le=1024)
    num_nodes: int = Field(1, ge=1, le=1024)
    backend: Backend = "auto"
    node_rank: int | None = Field(None, ge=0)
    master_addr: str | None = Field(None, min_length=1)
    master_port: int | None = Field(None, ge=1, le=65535)

    def to_training_config(self, **overrides: Any) -> TrainingConfig:
        return TrainingConfig(**{**self.model_dump(), **overrides})


class AMPConfig(_Schema):
    """The document's manual mixed-precision settings; ``ace3.Trainer(amp_config=...)`` applies
    them over the config's precision fields.

    Levels: O0 float32; O1 autocast (float32 weights, per-op 16-bit); O2 16-bit weights with a
    float32 master copy in the optimizer (BatchNorm kept float32 unless
    ``keep_batchnorm_fp32=False``); O3 everything 16-bit, no master copy. Loss scaling applies to
    float16 only (bfloat16 has float32's range).
    """

    enabled: bool = True
    opt_level: AmpLevel = "O1"
    dtype: AmpDtype = "auto"
    keep_batchnorm_fp32: bool | None = None
    loss_scale: Literal["dynamic", "static"] | float = "dynamic"
    init_scale: float = Field(2.0**16, gt=0.0)
    min_loss_scale: float = Field(1.0, gt=0.0)
    max_loss_scale: float = Field(2.0**24, gt=0.0)

    def training_fields(self) -> dict[str, Any]:
        """The :class:`TrainingConfig` fields these settings stand for: ``enabled`` and
        ``opt_level`` always, the others only when given (else the config's values stay)."""
        names = {
            "dtype": "amp_dtype",
            "keep_batchnorm_fp32": "keep_batchnorm_fp32",
            "loss_scale": "loss_scaling",
            "init_scale": "init_loss_scale",
            "min_loss_scale": "min_loss_scale",
            "max_loss_scale": "max_loss_scale",
        }
        fields = {"mixed_precision": self.enabled, "amp_level": self.opt_level}
        fields.update({names[k]: getattr(self, k) for k in names if k in self.model_fields_set})
        return fields


# CheckpointConfig's names for TrainingConfig fields (the others keep their names).
_CHECKPOINT_RENAMED = {
    "keep_best": "keep_best_checkpoint",
    "monitor": "checkpoint_monitor",
    "mode": "checkpoint_mode",
}


class CheckpointConfig(_Schema):
    """Where and how often checkpoints are written; ``ace3.Trainer(checkpoint_config=...)``.

    ``save_dir`` is a local directory: local runs write there; for remote jobs the SDK copies
    each checkpoint there as soon as the service has stored it. ``max_checkpoints`` keeps the
    newest N (never deleting the only verified one).

    ``keep_best=True`` also keeps the best checkpoint by ``monitor`` (``"val_loss"``,
    ``"val_accuracy"``, any ``val_<name>`` or ``"train_loss"``; ``mode`` ``"min"`` or ``"max"``:
    the names of :class:`~ace3.training.callbacks.ModelCheckpoint`), never pruned.
    ``async_save=True`` writes each checkpoint in the background while training continues.
    """

    save_dir: str | None = None
    save_interval: int | None = Field(None, ge=1)
    max_checkpoints: int | None = Field(None, ge=1)
    save_optimizer: bool = True
    save_scheduler: bool = True
    keep_best: bool = False
    monitor: MonitorName = "val_loss"
    mode: Literal["min", "max"] = "min"
    async_save: bool = False

    def training_fields(self) -> dict[str, Any]:
        """The fields given here (one left out keeps the training config's value)."""
        fields = (
            "save_interval", "max_checkpoints", "save_optimizer", "save_scheduler",
            "keep_best", "monitor", "mode", "async_save",
        )  # fmt: skip
        return {
            _CHECKPOINT_RENAMED.get(name, name): getattr(self, name)
            for name in fields
            if name in self.model_fields_set
        }
