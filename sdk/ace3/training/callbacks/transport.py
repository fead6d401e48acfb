"""Carry callbacks to a remote training job as data, and rebuild them inside the engine.

Callbacks are never pickled. :func:`callback_spec` turns one into a
:class:`~ace3.config.specs.CallbackSpec`:

- a built-in (``EarlyStopping``, ``ModelCheckpoint``, ``ReduceLROnPlateau``): its class name
  and init arguments;
- your own subclass of :class:`ace3.Callback`: the source code of its class, plus what that code
  needs from the file it is defined in, plus the instance's attributes (its ``__dict__``).

What the source code needs is found by reading the global names its methods load (and the names
its class statement uses: bases, decorators, defaults). Each one becomes:

- a module -> ``import x as name``;
- a class or function of an importable module -> ``from m import n as name`` (the job must be
  able to import it too: installed on the workers, or shipped in the model archive);
- a class or function defined in the same file as the callback -> its source code, collected
  the same way;
- a plain constant (numbers, strings, tuples, lists, dicts of those) -> ``name = <repr>``;
- anything else (a client, an open file, a tensor, a lambda) -> refused with
  :class:`~ace3.errors.UnsupportedFeatureError` naming it.

Instance attributes must be JSON values (non-finite floats are carried too); the engine sets them
on an instance made with ``cls.__new__(cls)``, so ``__init__`` does not run again in the job.
:func:`callbacks_from_specs` is the engine's side. No torch import here.
"""

from __future__ import annotations

import inspect
import linecache
import sys
import types
from collections.abc import Iterable, Mapping
from typing import Any

from ace3.config.specs import CallbackSpec
from ace3.training.callbacks.base import Callback, CallbackError
from ace3.training.callbacks.registry import BUILTIN_CALLBACKS, init_params
from ace3.training.callbacks.source_collector import SourceCollector
from ace3.training.callbacks.values import decode_value, encode_value, refuse

__all__ = ["callback_spec", "callbacks_from_specs"]

#: instance attributes the engine sets (never carried)
ENGINE_ATTRIBUTES = frozenset({"model"})
ENGINE_ATTRIBUTE_PREFIX = "_ace3_"


def callback_spec(callback: Any) -> CallbackSpec:
    """The spec that rebuilds ``callback`` in a training job (see the module docstring).

    Raises :class:`~ace3.errors.UnsupportedFeatureError` naming what cannot be carried.
    """
    if not isinstance(callback, Callback):
        kind = "a function" if callable(callback) else f"a {type(callback).__name__}"
        raise refuse(
            f"a callback must be an instance of an ace3.Callback subclass, not {kind} "
            f"({callback!r}): subclass ace3.Callback and override its on_* methods"
        )
    cls = type(callback)
    if BUILTIN_CALLBACKS.get(cls.__name__) is cls:
        params = {
            name: encode_value(value, f"{cls.__name__}.{name}")
            for name, value in init_params(callback).items()
        }
        return CallbackSpec(kind="builtin", name=cls.__name__, params=params)
    source = SourceCollector(cls).module_source()
    return CallbackSpec(
        kind="source", name=cls.__name__, params=_instance_params(callback), source=source
    )


def _instance_params(callback: Callback) -> dict[str, Any]:
    cls = type(callback)
    state = getattr(callback, "__dict__", None)
    if state is None:
        raise refuse(
            f"{cls.__name__} uses __slots__: a callback sent to a training job keeps its "
            "state in ordinary attributes; remove __slots__"
        )
    return {
        name: encode_value(value, f"{cls.__name__}.{name}")
        for name, value in state.items()
        if name not in ENGINE_ATTRIBUTES and not name.startswith(ENGINE_ATTRIBUTE_PREFIX)
    }


# -- engine side --------------------------------------------------------------------------------


def callbacks_from_specs(specs: Iterable[CallbackSpec | Mapping[str, Any]]) -> list[Callback]:
    """Rebuild callbacks from their specs: built-ins with ``cls(**params)``; carried classes by
    running their source in a fresh module (where ``ace3`` is importable) and setting the
    attributes on ``cls.__new__(cls)``."""
    callbacks: list[Callback] = []
    for index, raw in enumerate(specs):
        spec = raw if isinstance(raw, CallbackSpec) else CallbackSpec.model_validate(raw)
        params = decode_value(spec.params)
        if spec.kind == "builtin":
            builtin = BUILTIN_CALLBACKS.get(spec.name)
            if builtin is None:
                raise CallbackError(
                    f"callbacks[{index}]: unknown built-in callback {spec.name!r}; known: "
                    f"{', '.join(sorted(BUILTIN_CALLBACKS))}"
                )
            callbacks.append(builtin(**params))
            continue
        cls = _class_from_source(spec, index)
        instance = cls.__new__(cls)
        instance.__dict__.update(params)
        callbacks.append(instance)
    return callbacks


def _class_from_source(spec: CallbackSpec, index: int) -> type[Callback]:
    if not spec.source:
        raise CallbackError(f"callbacks[{index}] ({spec.name}): kind='source' needs its source")
    module_name = f"ace3_callback_{index}_{spec.name}"
    filename = f"<ace3 callback {index}: {spec.name}>"
    # Tracebacks through the carried code show its lines.
    linecache.cache[filename] = (len(spec.source), None, spec.source.splitlines(True), filename)
    module = types.ModuleType(module_name)
    module.__file__ = filename
    sys.modules[module_name] = module
    exec(compile(spec.source, filename, "exec"), module.__dict__)
    cls = module.__dict__.get(spec.name)
    if not (inspect.isclass(cls) and issubclass(cls, Callback)):
        raise CallbackError(
            f"callbacks[{index}]: the carried source does not define an ace3.Callback subclass "
            f"named {spec.name!r}"
        )
    return cls
