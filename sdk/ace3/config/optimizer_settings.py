"""Carry a client-built optimizer to a remote job as ``TrainingConfig`` fields.

A job never receives pickled objects: the engine rebuilds the optimizer from the config's
``optimizer``, ``learning_rate``, ``weight_decay``, ``betas``, ``eps`` and ``momentum``
(``ace3.runtime.loop.optim.build_optimizer``). :func:`optimizer_settings` reads those from the
optimizer the user built, and refuses, with :class:`ace3.errors.UnsupportedFeatureError` naming
the option, anything the rebuilt optimizer would not reproduce exactly.

Imports torch lazily (only to recognise the torch classes); the module itself is torch-free.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from ace3.config import ConfigProblem, TrainingConfig
from ace3.config.torch_optimizers import TORCH_OPTIMIZERS
from ace3.errors import UnsupportedFeatureError

# Options that must keep their default for each kind, with what the engine would do instead.
_ADAM_DEFAULTS = {"amsgrad": False, "maximize": False}
_SGD_DEFAULTS = {"dampening": 0.0, "nesterov": False, "maximize": False}
_ACE3_ADAM8BIT_DEFAULTS = {"block_size": 256, "min_8bit_size": 4096}
_BNB_ARG_DEFAULTS = {
    "min_8bit_size": 4096,
    "percentile_clipping": 100,
    "block_wise": True,
    "max_unorm": 0.0,
    "skip_zeros": False,
}
_LION_DEFAULTS = {"weight_decouple": True, "fixed_decay": False, "maximize": False}
_ADAFACTOR_DEFAULTS = {"maximize": False}
_ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
_SGD_KEYS = ("lr", "momentum", "weight_decay")
_LION_KEYS = ("lr", "betas", "weight_decay")
_ADAFACTOR_KEYS = ("lr", "beta2_decay", "eps", "d", "weight_decay")
SUPPORTED = (
    "any torch.optim class (its own, not a subclass), "
    "ace3.optimizers.MemoryEfficientAdam, ace3.training.optimizers.Adam8bit, "
    "bitsandbytes.optim.Adam8bit / AdamW8bit, pytorch_optimizer.Lion"
)


def optimizer_settings(optimizer: Any, model: Any = None) -> dict[str, Any]:
    """The ``TrainingConfig`` fields that rebuild ``optimizer`` in a job.

    Returns ``optimizer`` (adamw, adam, sgd, memory_efficient_adam, adam8bit, adafactor or
    lion), ``learning_rate`` and ``weight_decay``, plus ``betas`` and ``eps`` for the Adam
    family, ``momentum`` for SGD, ``lion_betas`` for ``pytorch_optimizer.Lion`` or
    ``adafactor_beta2_decay`` / ``adafactor_eps`` / ``adafactor_d`` for
    ``torch.optim.Adafactor``. Any other ``torch.optim`` class (``RMSprop``, ``Adadelta``, ...)
    is carried by its class name with ``learning_rate``, ``weight_decay`` and, in
    ``optimizer_kwargs``, its arguments that differ from the class's defaults. Other
    pytorch-optimizer classes (SophiaH, GaLore: their state
    or parameter groups are the engine's own) are refused: set ``optimizer="sophia"`` or
    ``"galore_adamw"`` in the config instead. ``learning_rate`` is the group's ``initial_lr`` when a scheduler has
    been attached (the schedule's base), else its ``lr``. ``torch.optim.Adam(...,
    decoupled_weight_decay=True)`` is carried as ``adamw``.

    With ``model``, also checks that the optimizer holds exactly the model's trainable
    parameters: the engine optimizes every parameter with ``requires_grad=True``.

    Raises ``UnsupportedFeatureError`` for another class (or a subclass), several parameter
    groups with different hyperparameters, or an option the engine does not reproduce
    (``amsgrad``, ``maximize``, ``nesterov``, SGD ``dampening``, a non-default Adam8bit block
    size, ...), naming the option.
    """
    by_class = _class_name_settings(optimizer)
    if by_class is not None:
        if model is not None:
            _check_covers_model(optimizer, model)
        _check_config_accepts(by_class)
        return by_class
    name, keys, fixed = _identify(optimizer)
    groups = list(getattr(optimizer, "param_groups", []))
    if not groups:
        _refuse("optimizer", f"{type(optimizer).__name__} has no parameter groups")
    _check_groups_agree(groups, keys + tuple(fixed))
    group = groups[0]
    for option, default in fixed.items():
        value = _read_option(optimizer, group, option, default)
        if value != default:
            _refuse(
                option,
                f"{type(optimizer).__name__}({option}={value!r}) cannot be carried to a job: "
                f"the engine builds it with {option}={default!r}",
            )
    settings: dict[str, Any] = {
        "optimizer": name,
        "learning_rate": float(group.get("initial_lr", group["lr"])),
        "weight_decay": float(group["weight_decay"]),
    }
    if name == "lion":
        settings["lion_betas"] = (float(group["betas"][0]), float(group["betas"][1]))
    elif name == "adafactor":
        eps1, eps2 = group["eps"]
        settings["adafactor_beta2_decay"] = float(group["beta2_decay"])
        settings["adafactor_eps"] = (None if eps1 is None else float(eps1), float(eps2))
        settings["adafactor_d"] = float(group["d"])
    elif "betas" in keys:
        settings["betas"] = (float(group["betas"][0]), float(group["betas"][1]))
        settings["eps"] = float(group["eps"])
    else:
        settings["momentum"] = float(group["momentum"])
    if model is not None:
        _check_covers_model(optimizer, model)
    _check_config_accepts(settings)
    return settings


def _class_name_settings(optimizer: Any) -> dict[str, Any] | None:
    """Another ``torch.optim`` class (``RMSprop``, ``Adadelta``, ...: not AdamW, Adam, SGD or
    Adafactor, which keep ACE3's names) as a class-name optimizer: ``learning_rate``,
    ``weight_decay`` and, in ``optimizer_kwargs``, every other argument that differs from the
    class's default; None for any other optimizer."""
    import inspect

    torch = sys.modules.get("torch")
    cls = type(optimizer)
    name = cls.__name__
    if torch is None or name not in TORCH_OPTIMIZERS or getattr(torch.optim, name) is not cls:
        return None
    if name in ("AdamW", "Adam", "SGD", "Adafactor"):
        return None
    groups = list(optimizer.param_groups)
    if not groups:
        _refuse("optimizer", f"{name} has no parameter groups")
    _check_groups_agree(groups, TORCH_OPTIMIZERS[name])
    group = groups[0]
    signature = inspect.signature(cls.__init__).parameters
    kwargs: dict[str, Any] = {}
    for arg in TORCH_OPTIMIZERS[name]:
        if arg in ("lr", "weight_decay") or arg not in group:
            continue
        value = _plain(group[arg], arg)
        if value != _plain(signature[arg].default, arg):
            kwargs[arg] = value
    settings: dict[str, Any] = {
        "optimizer": name,
        "learning_rate": float(group.get("initial_lr", group["lr"])),
    }
    if "weight_decay" in TORCH_OPTIMIZERS[name]:
        decay = float(group.get("weight_decay", 0.0))
        if decay:
            settings["weight_decay"] = decay
        elif decay != _plain(signature["weight_decay"].default, "weight_decay"):
            # weight_decay=0 leaves the class's own default (Muon's 0.1): turn it off by name
            kwargs["weight_decay"] = 0.0
    if kwargs:
        settings["optimizer_kwargs"] = kwargs
    return settings


def _plain(value: Any, option: str) -> Any:
    """A hyperparameter as JSON carries it (tuples as lists, 0-d tensors as numbers)."""
    if isinstance(value, tuple | list):
        return [_plain(item, option) for item in value]
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    _refuse(option, f"{option}={value!r} cannot be carried to a job (not a JSON value)")
    raise AssertionError("unreachable")


def _identify(optimizer: Any) -> tuple[str, tuple[str, ...], dict[str, Any]]:
    """(config name, hyperparameter keys carried, options that must keep a default)."""
    cls = type(optimizer)
    ace3_optimizers = sys.modules.get("ace3.training.optimizers")
    if ace3_optimizers is not None:
        if cls is ace3_optimizers.MemoryEfficientAdam:
            return "memory_efficient_adam", _ADAM_KEYS, {}
        if cls is ace3_optimizers.Adam8bit:
            fixed = {} if optimizer.backend == "bitsandbytes" else _ACE3_ADAM8BIT_DEFAULTS
            return "adam8bit", _ADAM_KEYS, dict(fixed)
    torch = sys.modules.get("torch")
    if torch is not None:
        if cls is torch.optim.AdamW:
            return "adamw", _ADAM_KEYS, dict(_ADAM_DEFAULTS)
        if cls is torch.optim.Adam:
            decoupled = bool(optimizer.param_groups[0].get("decoupled_weight_decay", False))
            return ("adamw" if decoupled else "adam"), _ADAM_KEYS, dict(_ADAM_DEFAULTS)
        if cls is torch.optim.SGD:
            return "sgd", _SGD_KEYS, dict(_SGD_DEFAULTS)
        if cls is getattr(torch.optim, "Adafactor", None):
            return "adafactor", _ADAFACTOR_KEYS, dict(_ADAFACTOR_DEFAULTS)
    library = sys.modules.get("pytorch_optimizer")
    if library is not None and cls is getattr(library, "Lion", None):
        return "lion", _LION_KEYS, dict(_LION_DEFAULTS)
    bnb = sys.modules.get("bitsandbytes")
    if bnb is not None and cls in (bnb.optim.Adam8bit, bnb.optim.AdamW8bit):
        return "adam8bit", _ADAM_KEYS, {**_BNB_ARG_DEFAULTS, "is_paged": False}
    _refuse(
        "optimizer",
        f"{cls.__module__}.{cls.__qualname__} cannot be carried to a job; supported: {SUPPORTED}",
    )
    raise AssertionError("unreachable")


def _read_option(optimizer: Any, group: dict[str, Any], option: str, default: Any) -> Any:
    """An option from the group, or (bitsandbytes) from the optimizer's ``args``/attributes."""
    if option in group:
        return group[option]
    args = getattr(optimizer, "args", None)
    if args is not None and hasattr(args, option):
        return getattr(args, option)
    return getattr(optimizer, option, default)


def _check_groups_agree(groups: list[dict[str, Any]], keys: Iterable[str]) -> None:
    first = groups[0]
    for index, group in enumerate(groups[1:], start=1):
        for key in ("initial_lr", *keys):
            if key in first and first.get(key) != group.get(key):
                _refuse(
                    key,
                    f"parameter groups 0 and {index} differ in {key!r} ({first.get(key)!r} vs "
                    f"{group.get(key)!r}); a job optimizes all parameters with one setting, so "
                    "use a single group (or equal settings in every group)",
                )


def _check_covers_model(optimizer: Any, model: Any) -> None:
    optimized = {id(param) for group in optimizer.param_groups for param in group["params"]}
    trainable = {id(param) for param in model.parameters() if param.requires_grad}
    if optimized != trainable:
        _refuse(
            "params",
            f"the optimizer holds {len(optimized)} parameter tensors but the model has "
            f"{len(trainable)} trainable ones ({len(trainable - optimized)} not optimized, "
            f"{len(optimized - trainable)} not trainable in the model); a job optimizes every "
            "parameter with requires_grad=True: freeze the others with requires_grad=False",
        )


def _check_config_accepts(settings: dict[str, Any]) -> None:
    try:
        TrainingConfig(**settings)
    except ValueError as exc:  # pydantic.ValidationError
        errors: list[dict[str, Any]] = getattr(exc, "errors", lambda: [])()
        problems = [
            ConfigProblem(field=".".join(map(str, err["loc"])) or "optimizer", reason=err["msg"])
            for err in errors
        ]
        raise UnsupportedFeatureError(
            "the optimizer's settings are outside what a job accepts: "
            + "; ".join(f"{p.field}: {p.reason}" for p in problems),
            problems,
        ) from None


def _refuse(field: str, reason: str) -> None:
    raise UnsupportedFeatureError(reason, [ConfigProblem(field=field, reason=reason)])
