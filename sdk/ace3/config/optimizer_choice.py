"""Which optimizer a job runs: one of ACE3's own names, or any ``torch.optim`` class by name.

``TrainingConfig.optimizer`` takes ACE3's lowercase names (``adamw``, ``adam``, ``sgd``, ...,
built with ``betas``/``eps``/``momentum``) or a case-sensitive ``torch.optim`` class name
(``"Adadelta"``, ``"SGD"``, ``"RMSprop"``, ...: :data:`ace3.config.torch_optimizers.TORCH_OPTIMIZERS`).
A class-name optimizer is built as ``torch.optim.<Name>(params, lr=learning_rate,
[weight_decay=weight_decay when it is not 0], **optimizer_kwargs)``: torch's own defaults for
everything else, none of ACE3's ``betas``/``eps``/``momentum``.

Everything here is checked without torch, when the config is made (the SDK, the API): the name,
that every ``optimizer_kwargs`` key is an argument of that class, and that its value has the
JSON kind of that argument's annotation (a number, an integer, a boolean, a string, null where
the argument takes None, an array of the right length). Ranges (a negative ``rho``) are checked
by the class itself when the engine builds it (an error naming ``optimizer_kwargs``).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, JsonValue, ValidationInfo

from ace3.config.torch_optimizers import TORCH_OPTIMIZERS

#: ACE3's own optimizer names (lowercase), each built with ACE3's settings fields.
ACE3_OPTIMIZERS = (
    "adamw",
    "adam",
    "sgd",
    "memory_efficient_adam",
    "adam8bit",
    "lion",
    "sophia",
    "galore_adamw",
    "adafactor",
)

#: torch.optim classes the engine's step cannot drive, with the reason.
UNSTEPPABLE = {
    "LBFGS": "torch.optim.LBFGS steps with a closure that re-runs the forward and backward "
    "passes several times per step; ACE3's step calls optimizer.step() once, after one "
    "backward pass (and its gradient synchronisation): use another optimizer",
}

#: optimizer_kwargs keys that another field already sets.
_RESERVED = {
    "lr": "the learning rate is learning_rate (schedules start from it): set learning_rate",
    "params": "the engine passes the model's trainable parameters itself",
}


def is_class_name(name: str) -> bool:
    """True for a ``torch.optim`` class name (as opposed to one of ACE3's own names)."""
    return name in TORCH_OPTIMIZERS


def check_optimizer_name(name: str, info: ValidationInfo) -> str:
    """``optimizer``: one of ACE3's names or a ``torch.optim`` class name (case-sensitive)."""
    if name not in ACE3_OPTIMIZERS and name not in TORCH_OPTIMIZERS:
        hint = next((c for c in TORCH_OPTIMIZERS if c.lower() == name.lower()), None)
        did_you_mean = f" (did you mean {hint!r}? class names are case-sensitive)" if hint else ""
        raise ValueError(
            f"unknown optimizer {name!r}{did_you_mean}; choose one of ACE3's "
            f"{', '.join(ACE3_OPTIMIZERS)} or a torch.optim class name: "
            f"{', '.join(TORCH_OPTIMIZERS)}"
        )
    if name in UNSTEPPABLE:
        raise ValueError(UNSTEPPABLE[name])
    # An assignment (at construction optimizer_kwargs comes later and checks itself).
    kwargs = (info.data or {}).get("optimizer_kwargs")  # (no data: validated on its own)
    if kwargs:
        _check_kwargs_fit(name, kwargs)
    return name


def check_optimizer_kwargs(kwargs: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
    """``optimizer_kwargs``: only with a class-name optimizer, and only its arguments."""
    name = (info.data or {}).get("optimizer")
    if name is not None and kwargs:  # (None: the name was refused already)
        _check_kwargs_fit(name, kwargs)
    return kwargs


def _check_kwargs_fit(name: str, kwargs: dict[str, Any]) -> None:
    if not is_class_name(name):
        raise ValueError(
            f"optimizer_kwargs is for a torch.optim class name (e.g. optimizer='Adadelta'); "
            f"optimizer={name!r} is ACE3's own, set by learning_rate, weight_decay, betas, eps "
            "and momentum: remove optimizer_kwargs, or name the torch class "
            f"(e.g. {_class_for(name)!r})"
        )
    for key in kwargs:
        if key in _RESERVED:
            raise ValueError(f"optimizer_kwargs[{key!r}]: {_RESERVED[key]}")
    accepted = TORCH_OPTIMIZERS[name]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ValueError(
            f"optimizer_kwargs {', '.join(map(repr, unknown))}: not an argument of "
            f"torch.optim.{name}, which takes {', '.join(a for a in accepted if a != 'lr')}"
        )
    for key, value in kwargs.items():
        kind = accepted[key]
        if not _has_kind(value, kind):
            raise ValueError(
                f"optimizer_kwargs[{key!r}]: {value!r} is not {_describe(kind)}, which "
                f"torch.optim.{name}'s {key!r} takes"
            )


def _has_kind(value: Any, kind: str) -> bool:
    """Whether a JSON value has a kind of the generated table (see ``torch_optimizers``)."""
    if kind.endswith("?"):
        return value is None or _has_kind(value, kind[:-1])
    if kind.startswith("("):
        items = _tuple_items(kind)
        return (
            isinstance(value, list | tuple)
            and len(value) == len(items)
            and all(_has_kind(v, k) for v, k in zip(value, items, strict=True))
        )
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    return True  # "any": an argument without an annotation


def _tuple_items(kind: str) -> list[str]:
    return kind[1:-1].split(",")  # (kinds of items are never nested tuples in torch.optim)


def _describe(kind: str) -> str:
    if kind.endswith("?"):
        return f"{_describe(kind[:-1])} or null"
    if kind.startswith("("):
        items = _tuple_items(kind)
        return f"a list of {len(items)} ({', '.join(_describe(k) for k in items)})"
    return {"integer": "an integer", "any": "a value"}.get(kind, f"a {kind}")


def _class_for(name: str) -> str:
    return {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "adafactor": "Adafactor"}.get(
        name, "AdamW"
    )


def class_optimizer_problems(config: Any) -> list[tuple[str, str]]:
    """(field, reason) for settings a class-name optimizer would ignore or get twice:
    ``weight_decay`` for a class without it (or also in ``optimizer_kwargs``), and ACE3's
    ``betas``/``eps``/``momentum`` changed from their defaults (they are not used: the class
    takes them from ``optimizer_kwargs``)."""
    name = config.optimizer
    if not is_class_name(name):
        return []
    problems: list[tuple[str, str]] = []
    kwargs = config.optimizer_kwargs
    if config.weight_decay:
        if "weight_decay" not in TORCH_OPTIMIZERS[name]:
            problems.append(("weight_decay", f"torch.optim.{name} has no weight decay: set "
                             "weight_decay=0"))  # fmt: skip
        elif "weight_decay" in kwargs:
            problems.append(("weight_decay", "set twice, here and in optimizer_kwargs: keep "
                             "one"))  # fmt: skip
    defaults = {"betas": (0.9, 0.999), "eps": 1e-8, "momentum": 0.9}
    for field, default in defaults.items():
        value = getattr(config, field)
        if (tuple(value) if isinstance(value, list | tuple) else value) != default:
            where = (
                f"optimizer_kwargs={{{field!r}: ...}}"
                if field in TORCH_OPTIMIZERS[name]
                else f"nothing: torch.optim.{name} has no {field!r}"
            )
            problems.append((field, f"ACE3's setting for its own optimizers; torch.optim."
                             f"{name} is built with torch's defaults and optimizer_kwargs: "
                             f"set {where}"))  # fmt: skip
    return problems


OptimizerName = Annotated[str, AfterValidator(check_optimizer_name)]
OptimizerKwargs = Annotated[dict[str, JsonValue], AfterValidator(check_optimizer_kwargs)]
