"""Import the user's model code and resolve what the engine calls in it.

``kind='file'``: the ``.py`` file is imported as module ``ace3_user_model`` (its directory is put
on ``sys.path`` so it can import its siblings). ``kind='archive'``: the directory goes on
``sys.path`` and ``entry_module`` is imported. ``kind='huggingface'``: a model directory built
with ``from_pretrained`` (:mod:`ace3.runtime.hf_model`), nothing imported from it. The module provides:

- the factory named by the job: a function ``build_model(**kwargs) -> nn.Module`` or a class;
- optionally ``compute_loss(model, batch) -> Tensor`` (replaces the default loss). In training
  ``model`` is the DDP wrapper: call it (``model(x)``) so gradients synchronise, and reach the
  user's own attributes through ``model.module``; in validation it is the plain module;
- optionally ``compute_metrics(model, batch) -> dict[str, float]``, called on every validation
  batch; each value is averaged over the validation set, weighted by batch size, and reported
  as ``val_<name>``.
- optionally ``configure_optimizers(model)`` returning the optimizer (and optionally a
  scheduler) to train with instead of the config's: see
  :mod:`ace3.runtime.loop.configured_optimizer`.

Errors raised by user code propagate unchanged, with their traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from ace3.runtime.hf_model import FACTORY, pretrained_factory
from ace3.runtime.job_spec import ModelSpec

USER_MODULE_NAME = "ace3_user_model"

LossFn = Callable[[nn.Module, Any], Any]
MetricsFn = Callable[[nn.Module, Any], Mapping[str, float]]


@dataclass(frozen=True)
class UserCode:
    """The resolved pieces of a user's model module."""

    module: ModuleType
    factory: Callable[..., Any]
    factory_name: str
    compute_loss: LossFn | None
    compute_metrics: MetricsFn | None
    configure_optimizers: Callable[[nn.Module], Any] | None = None
    source_dir: Path | None = None  # kind='huggingface': the model directory it is built from


def _add_sys_path(directory: Path, first: bool) -> None:
    entry = str(directory)
    if entry not in sys.path:
        if first:
            sys.path.insert(0, entry)
        else:  # a teacher's code never shadows the student's own modules
            sys.path.append(entry)


def _refuse_shadowed_package(path: Path, entry_module: str) -> None:
    """A second model package (a distillation teacher's) whose top-level module is already
    imported from elsewhere would silently get that other module: refused instead."""
    top = entry_module.split(".")[0]
    loaded = sys.modules.get(top)
    origin = getattr(loaded, "__file__", None) if loaded is not None else None
    if loaded is not None and (origin is None or not Path(origin).resolve().is_relative_to(path)):
        raise ValueError(
            f"the teacher's package imports as {top!r}, a name the student's code already "
            "uses: give one of the two packages another top-level name"
        )


def import_model_module(spec: ModelSpec, module_name: str = USER_MODULE_NAME) -> ModuleType:
    """Import the module named by the spec (see the module docstring); a ``.py`` file becomes
    ``module_name`` (a distillation teacher's file gets a name of its own)."""
    path = Path(spec.path).resolve()
    if spec.kind == "archive":
        if not path.is_dir():
            raise FileNotFoundError(f"model archive directory not found: {path}")
        assert spec.entry_module is not None  # checked by ModelSpec
        if module_name != USER_MODULE_NAME:
            _refuse_shadowed_package(path, spec.entry_module)
        _add_sys_path(path, first=module_name == USER_MODULE_NAME)
        return importlib.import_module(spec.entry_module)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    if path.suffix != ".py":
        raise ValueError(f"model file {path} must be a Python source file (.py)")
    _add_sys_path(path.parent, first=module_name == USER_MODULE_NAME)
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import model file {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _resolve_attr(module: ModuleType, dotted: str) -> Any:
    target: Any = module
    for part in dotted.split("."):
        if not hasattr(target, part):
            public = sorted(
                name
                for name, value in vars(module).items()
                if callable(value) and not name.startswith("_")
            )
            raise AttributeError(
                f"model module {module.__name__!r} has no factory {dotted!r}; "
                f"callables it defines: {', '.join(public) or 'none'}"
            )
        target = getattr(target, part)
    return target


def _optional_callable(module: ModuleType, name: str) -> Any:
    value = getattr(module, name, None)
    if value is not None and not callable(value):
        raise TypeError(
            f"{name} in the model module must be a function, got {type(value).__name__}"
        )
    return value


def load_user_code(spec: ModelSpec, module_name: str = USER_MODULE_NAME) -> UserCode:
    """Import the module and resolve its factory and optional hooks; a Hugging Face model
    directory's factory is ``from_pretrained`` (:mod:`ace3.runtime.hf_model`), with no hooks."""
    if spec.kind == "huggingface":
        directory = Path(spec.path).resolve()
        factory = pretrained_factory(directory)
        module = ModuleType(module_name, f"the Hugging Face model in {directory}")
        module.from_pretrained = factory  # type: ignore[attr-defined]  # a module made here
        return UserCode(module, factory, FACTORY, None, None, source_dir=directory)
    module = import_model_module(spec, module_name)
    factory = _resolve_attr(module, spec.factory)
    if not callable(factory):
        raise TypeError(f"model factory {spec.factory!r} is not callable: {type(factory).__name__}")
    return UserCode(
        module=module,
        factory=factory,
        factory_name=spec.factory,
        compute_loss=_optional_callable(module, "compute_loss"),
        compute_metrics=_optional_callable(module, "compute_metrics"),
        configure_optimizers=_optional_callable(module, "configure_optimizers"),
    )


def build_model(user: UserCode, kwargs: Mapping[str, Any]) -> nn.Module:
    """Call the factory (function or class) with the job's kwargs; it must give an nn.Module."""
    model = user.factory(**dict(kwargs))
    if not isinstance(model, nn.Module):
        kind = "class" if inspect.isclass(user.factory) else "function"
        raise TypeError(
            f"model factory {user.factory_name!r} ({kind}) returned {type(model).__name__}, "
            "expected a torch.nn.Module"
        )
    return model
