"""Mixed-precision levels O0-O3 for the engine, from the config's precision fields.

``mixed_precision=False`` is O0 whatever ``amp_level`` says. The 16-bit dtype comes from
``amp_dtype`` (``auto``: bfloat16 on CPU and on GPUs that support it, float16 elsewhere).

- **O0**: float32 everywhere, no autocast.
- **O1**: float32 weights; forward passes under ``torch.autocast`` with the 16-bit dtype.
- **O2**: weights cast to the 16-bit dtype (BatchNorm kept float32 unless
  ``keep_batchnorm_fp32=False``), the optimizer updates float32 master copies
  (:mod:`ace3.runtime.loop.master_weights`); forward passes also run under autocast. Forward hooks
  cast the model's floating inputs to the 16-bit dtype and its floating outputs to float32 (so
  losses are computed in float32); a float32 BatchNorm gets float32 inputs and hands back
  16-bit outputs.
- **O3**: everything 16-bit (BatchNorm too unless ``keep_batchnorm_fp32=True``), no master
  copy, no autocast; the same input/output casts as O2.

Loss scaling (:mod:`ace3.training.amp`) is active for float16 only. Loop order per optimizer step:
``zero_grad`` → forward under ``autocast()`` → ``scaler.scale(loss / k).backward()`` per
micro-batch → ``grads_to_optimizer()`` → (``scaler.unscale_`` + clip ``clip_parameters``) →
``scaler.step`` → ``scaler.update()`` → ``weights_from_optimizer()``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ace3.config import TrainingConfig
from ace3.config.training import AmpLevel
from ace3.runtime.loop.master_weights import MasterWeights, float32_state_dict
from ace3.training.amp.autocasting import resolve_amp_dtype
from ace3.training.amp.loss_scaler import LossScaler
from ace3.training.amp.scalers import make_loss_scaler

_PREPARED_ATTR = "_ace3_precision_level"


def cast_floating(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with every floating tensor in it (nested tuples, lists, dicts, dataclasses)
    cast to ``dtype``; integer tensors and everything else untouched."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.dtype != dtype:
            return value.to(dtype)
        return value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(cast_floating(item, dtype) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(cast_floating(item, dtype) for item in value)
    if type(value) is dict:
        return {key: cast_floating(item, dtype) for key, item in value.items()}
    if isinstance(value, MutableMapping):  # e.g. a transformers ModelOutput: cast in place
        for key in list(value.keys()):
            value[key] = cast_floating(value[key], dtype)
        return value
    if isinstance(value, Mapping):
        return {key: cast_floating(item, dtype) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            field.name: cast_floating(getattr(value, field.name), dtype)
            for field in dataclasses.fields(value)
            if field.init
        }
        try:
            return dataclasses.replace(value, **changes)
        except (TypeError, ValueError):  # a dataclass that cannot be rebuilt: left as it is
            return value
    return value


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class Precision:
    """One run's precision: how the model is cast, how forwards run, what the optimizer sees.

    Bound to one model by :meth:`prepare_model`. ``dtype`` is the 16-bit type (None for O0).
    """

    def __init__(
        self,
        level: AmpLevel,
        dtype: torch.dtype | None,
        device_type: str,
        keep_batchnorm_fp32: bool = False,
        config: TrainingConfig | None = None,
    ) -> None:
        if level not in ("O0", "O1", "O2", "O3"):
            raise ValueError(f"level must be one of O0, O1, O2, O3, got {level!r}")
        if (level == "O0") != (dtype is None):
            raise ValueError(
                f"level={level!r} with dtype={dtype}: O0 takes dtype=None, O1-O3 a 16-bit dtype "
                "(torch.float16 or torch.bfloat16)"
            )
        if dtype is not None and dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype}")
        self.level: AmpLevel = level
        self.dtype = dtype
        self.device_type = device_type
        self.keep_batchnorm_fp32 = bool(keep_batchnorm_fp32) and level in ("O2", "O3")
        self.config = config if config is not None else TrainingConfig()
        self.scaler: LossScaler | None = None
        self._model: nn.Module | None = None
        self._masters: MasterWeights | None = None
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []

    # -- what this level does -------------------------------------------------------------------
    @property
    def enabled(self) -> bool:
        """False for O0 (plain float32)."""
        return self.dtype is not None

    @property
    def needs_scaler(self) -> bool:
        """Loss scaling applies to float16 only (bfloat16 has float32's range)."""
        return self.dtype == torch.float16

    @property
    def casts_model(self) -> bool:
        """O2/O3: the model's weights are stored in the 16-bit dtype."""
        return self.level in ("O2", "O3")

    @property
    def uses_master_weights(self) -> bool:
        return self.level == "O2"

    @property
    def model_dtype(self) -> torch.dtype:
        """The dtype of the model's (non-BatchNorm) weights."""
        return self.dtype if self.casts_model and self.dtype is not None else torch.float32

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The context for forward passes: autocast for O1/O2, nothing for O0/O3."""
        if self.dtype is None or self.level == "O3":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def describe(self) -> str:
        """For logs, e.g. ``O2 bfloat16 (fp32 master weights, BatchNorm fp32)``."""
        if self.dtype is None:
            return "O0 float32"
        name = _name(self.dtype)
        if self.level == "O1":
            details = ["autocast, fp32 weights"]
        else:
            details = ["fp32 master weights" if self.level == "O2" else "no master weights"]
            details.append(f"BatchNorm {'fp32' if self.keep_batchnorm_fp32 else name}")
        if self.needs_scaler:
            scaler = self.scaler or make_loss_scaler(self.config, self.dtype)
            kind = "dynamic" if scaler.dynamic else "static"
            details.append(f"{kind} loss scale {scaler.get_scale():g}")
        return f"{self.level} {name} ({', '.join(details)})"

    # -- the model ------------------------------------------------------------------------------
    def prepare_model(self, model: nn.Module) -> nn.Module:
        """Cast ``model`` for this level and install its hooks; returns it.

        Call once, after ``model.to(device)`` and before wrapping it (DDP) or building the
        optimizer. O0/O1 leave the model as it is.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if self._model is not None and self._model is not model:
            raise RuntimeError(
                "this Precision already prepared another model: use one resolve_precision() "
                "per model"
            )
        if getattr(model, _PREPARED_ATTR, None) is not None:
            raise RuntimeError("prepare_model(model) was already called for this model")
        setattr(model, _PREPARED_ATTR, self.level)
        self._model = model
        if not self.casts_model:
            return model
        dtype = self.model_dtype
        model.to(dtype)
        hooks = self._hooks
        if self.keep_batchnorm_fp32:
            for module in model.modules():
                if isinstance(module, _BatchNorm):
                    module.float()
                    hooks.append(module.register_forward_pre_hook(_inputs_to(torch.float32)))
                    hooks.append(module.register_forward_hook(_output_to(dtype)))
        hooks.append(model.register_forward_pre_hook(_inputs_to(dtype), with_kwargs=True))
        hooks.append(model.register_forward_hook(_output_to(torch.float32)))
        if self.uses_master_weights:
            self._masters = MasterWeights(model)
        return model

    def restore_model(self, model: nn.Module) -> nn.Module:
        """Undo :meth:`prepare_model` after training: the model gets its full-precision
        weights back (the masters for O2) as float32, without the casting hooks; returns it.

        For a model trained in-process that the caller keeps using. This Precision is then
        unbound (a later :meth:`prepare_model` may bind it again).
        """
        self._require(model)
        if self.casts_model:
            state = self.model_state_dict(model)
            for handle in self._hooks:
                handle.remove()
            self._hooks.clear()
            model.float()
            model.load_state_dict(state)
        delattr(model, _PREPARED_ATTR)
        self._model = None
        self._masters = None
        return model

    def _require(self, model: nn.Module | None = None) -> nn.Module:
        if self._model is None:
            raise RuntimeError("call precision.prepare_model(model) first")
        if model is not None and model is not self._model:
            raise ValueError(
                "model is not the one given to prepare_model(); pass the plain module "
                "(not its DDP wrapper)"
            )
        return self._model

    def optimizer_parameters(self, model: nn.Module) -> list[nn.Parameter]:
        """What to build the optimizer on: the float32 masters (O2) or the trainable params."""
        self._require(model)
        if self._masters is not None:
            return self._masters.parameters()
        return [param for param in model.parameters() if param.requires_grad]

    def named_optimizer_parameters(self, model: nn.Module) -> list[tuple[str, nn.Parameter]]:
        """:meth:`optimizer_parameters` with the model's parameter names (for param groups)."""
        self._require(model)
        if self._masters is not None:
            return self._masters.named_parameters()
        return [(name, param) for name, param in model.named_parameters() if param.requires_grad]

    def clip_parameters(self, model: nn.Module) -> list[nn.Parameter]:
        """The parameters whose gradients to clip: the optimizer's."""
        return self.optimizer_parameters(model)

    # -- the step -------------------------------------------------------------------------------
    def make_scaler(self, config: TrainingConfig | None = None) -> LossScaler:
        """The loss scaler for this run (enabled for float16 only); remembered for
        :meth:`weights_from_optimizer`. ``config`` defaults to the one resolved from."""
        self.scaler = make_loss_scaler(config or self.config, self.dtype)
        return self.scaler

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Clear the optimizer's and the model's gradients (and a half-done scaler step)."""
        optimizer.zero_grad(set_to_none=True)
        if self._model is not None:
            self._model.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.abandon_step()

    def grads_to_optimizer(self) -> None:
        """O2: hand the model's 16-bit gradients to the float32 masters. Others: nothing."""
        if self._masters is not None:
            self._masters.grads_to_masters()

    def weights_from_optimizer(self, skipped: bool | None = None) -> None:
        """O2: round the stepped masters back into the model; nothing when the step was skipped
        (``skipped`` defaults to the scaler of :meth:`make_scaler`'s ``last_step_skipped``)."""
        if self._masters is None:
            return
        if skipped is None:
            skipped = self.scaler is not None and self.scaler.last_step_skipped
        if not skipped:
            self._masters.masters_to_model()

    # -- checkpoints ----------------------------------------------------------------------------
    def model_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """What a checkpoint stores: float32 weights at every level (the masters for O2)."""
        if not self.casts_model:
            return model.state_dict()
        self._require(model)
        if self._masters is not None:
            return self._masters.full_precision_state_dict(model)
        return float32_state_dict(model)

    def load_model_state_dict(
        self, model: nn.Module, state: Mapping[str, Any], strict: bool = True
    ) -> Any:
        """Load ``state`` (any precision) into the model, cast to its dtypes; O2 also sets the
        masters to the state's exact values. Returns ``load_state_dict``'s key report."""
        if self._masters is not None:
            self._require(model)
        report = model.load_state_dict(state, strict=strict)
        if self._masters is not None:
            self._masters.masters_from(state)
        return report


def _inputs_to(dtype: torch.dtype) -> Any:
    def hook(module: nn.Module, args: Any, kwargs: Any = None) -> Any:
        if kwargs is None:
            return cast_floating(args, dtype)
        return cast_floating(args, dtype), cast_floating(kwargs, dtype)

    return hook


def _output_to(dtype: torch.dtype) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        return cast_floating(output, dtype)

    return hook


def resolve_precision(config: TrainingConfig, device: torch.device) -> Precision:
    """The :class:`Precision` the config asks for on ``device``."""
    if not config.mixed_precision or config.amp_level == "O0":
        return Precision("O0", None, device.type, config=config)
    dtype = resolve_amp_dtype(config.amp_dtype, device.type)
    keep_bn = config.keep_batchnorm_fp32
    if keep_bn is None:
        keep_bn = config.amp_level == "O2"
    return Precision(config.amp_level, dtype, device.type, keep_bn, config=config)
