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

import ast
import builtins
import dis
import inspect
import linecache
import math
import os
import sys
import textwrap
import types
from collections.abc import Iterable, Mapping
from typing import Any

from ace3.config.specs import CallbackSpec
from ace3.errors import UnsupportedFeatureError
from ace3.training.callbacks import BUILTIN_CALLBACKS, Callback, CallbackError, init_params

__all__ = ["callback_spec", "callbacks_from_specs", "decode_value", "encode_value"]

#: instance attributes the engine sets (never carried)
ENGINE_ATTRIBUTES = frozenset({"model"})
ENGINE_ATTRIBUTE_PREFIX = "_ace3_"
_FLOAT_MARK = "__ace3_float__"  # {"__ace3_float__": "inf"}: a non-finite float in JSON
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME"})
_MAX_CONSTANT_CHARS = 100_000
_MOVE_HINT = (
    "create it inside the callback (for example in on_train_begin), or define it in the "
    "callback's own file or the model file"
)


def _refuse(message: str, field: str = "callbacks") -> UnsupportedFeatureError:
    return UnsupportedFeatureError(message, [{"field": field, "reason": message}])


# -- values -------------------------------------------------------------------------------------


def encode_value(value: Any, where: str) -> Any:
    """``value`` as JSON data (non-finite floats marked); refuses anything else, naming
    ``where``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {_FLOAT_MARK: "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, list | tuple):
        return [encode_value(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        encoded = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _refuse(
                    f"{where} has the key {key!r}: only string keys can be sent to a training "
                    "job (JSON); use strings as keys"
                )
            encoded[key] = encode_value(item, f"{where}[{key!r}]")
        return encoded
    raise _refuse(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which cannot be sent "
        "to a training job: a callback's attributes must be JSON values (None, bool, int, "
        "float, str, and lists or dicts of those); " + _MOVE_HINT
    )


def decode_value(value: Any) -> Any:
    """The inverse of :func:`encode_value` (tuples come back as lists)."""
    if isinstance(value, list):
        return [decode_value(item) for item in value]
    if isinstance(value, dict):
        if set(value) == {_FLOAT_MARK}:
            return float(value[_FLOAT_MARK])
        return {key: decode_value(item) for key, item in value.items()}
    return value


# -- client side: the spec ----------------------------------------------------------------------


def callback_spec(callback: Any) -> CallbackSpec:
    """The spec that rebuilds ``callback`` in a training job (see the module docstring).

    Raises :class:`~ace3.errors.UnsupportedFeatureError` naming what cannot be carried.
    """
    if not isinstance(callback, Callback):
        kind = "a function" if callable(callback) else f"a {type(callback).__name__}"
        raise _refuse(
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
    source = _SourceCollector(cls).module_source()
    return CallbackSpec(
        kind="source", name=cls.__name__, params=_instance_params(callback), source=source
    )


def _instance_params(callback: Callback) -> dict[str, Any]:
    cls = type(callback)
    state = getattr(callback, "__dict__", None)
    if state is None:
        raise _refuse(
            f"{cls.__name__} uses __slots__: a callback sent to a training job keeps its "
            "state in ordinary attributes; remove __slots__"
        )
    return {
        name: encode_value(value, f"{cls.__name__}.{name}")
        for name, value in state.items()
        if name not in ENGINE_ATTRIBUTES and not name.startswith(ENGINE_ATTRIBUTE_PREFIX)
    }


class _DefinitionNames(ast.NodeVisitor):
    """Names a ``class``/``def`` statement loads when it runs: decorators, bases, defaults and
    class-body statements; not function bodies (their code objects are read instead) and not
    annotations (the carried module has ``from __future__ import annotations``)."""

    def __init__(self) -> None:
        self.loads: set[str] = set()
        self.bound: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        (self.loads if isinstance(node.ctx, ast.Load) else self.bound).add(node.id)

    def _arguments(self, args: ast.arguments) -> None:
        for default in [*args.defaults, *args.kw_defaults]:
            if default is not None:
                self.visit(default)
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                self.bound.add(arg.arg)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.bound.add(node.name)
        for decorator in node.decorator_list:
            self.visit(decorator)
        self._arguments(node.args)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._arguments(node.args)
        self.visit(node.body)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.bound.add(node.name)
        for child in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(child)
        for statement in node.body:
            self.visit(statement)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            self.bound.add((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import


def _code_globals(code: types.CodeType) -> set[str]:
    """Global names a code object (and the code nested in it) loads or stores."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in _GLOBAL_OPS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_globals(const)
    return {name for name in names if isinstance(name, str)}


def _functions_of(cls: type) -> list[types.FunctionType]:
    """The plain functions behind a class's methods, properties and nested classes."""
    found: list[types.FunctionType] = []
    for value in vars(cls).values():
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        if isinstance(value, property):
            found.extend(f for f in (value.fget, value.fset, value.fdel) if inspect.isfunction(f))
        elif inspect.isfunction(value):
            found.append(value)
        elif inspect.isclass(value) and value.__qualname__.startswith(cls.__qualname__ + "."):
            found.extend(_functions_of(value))
    return found


def _normalized(path: str | None) -> str:
    return os.path.normcase(os.path.abspath(path)) if path else ""


def _import_path(value: Any) -> tuple[str, str] | None:
    """``(module, qualname)`` when importing that gives back this very object."""
    module_name = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if not isinstance(module_name, str) or not isinstance(qualname, str):
        return None
    if module_name == "__main__" or "<" in qualname:
        return None
    target: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    return (module_name, qualname) if target is value else None


def _is_plain_constant(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | str | bytes):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list | tuple | set | frozenset):
        return type(value) in (list, tuple, set) and all(_is_plain_constant(v) for v in value)
    if isinstance(value, dict):
        return type(value) is dict and all(
            _is_plain_constant(k) and _is_plain_constant(v) for k, v in value.items()
        )
    return False


class _SourceCollector:
    """Builds the module source that defines one callback class (see the module docstring)."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.home = cls.__module__
        self.lines: dict[str, list[str]] = {}  # global name -> its import/assignment lines
        self.blocks: list[str] = []  # shipped sources, dependencies first
        self.shipped: dict[int, str] = {}  # id(object) -> the name its source defines
        self.aliases: list[str] = []

    # -- entry ------------------------------------------------------------------------------
    def module_source(self) -> str:
        self._ship(self.cls, self.cls.__name__, used_by=self.cls.__name__)
        header = [
            "from __future__ import annotations",
            "",
            f"# {self.cls.__name__}, carried by ace3 from {self._origin(self.cls)}",
        ]
        ordered = sorted(
            self.lines.items(),
            key=lambda item: (not item[1][0].startswith(("import ", "from ")), item[0]),
        )
        definitions = [line for _, lines in ordered for line in lines]  # imports, then constants
        parts = ["\n".join(header + definitions), *self.blocks]
        if self.aliases:
            parts.append("\n".join(self.aliases))
        return "\n\n\n".join(parts) + "\n"

    @staticmethod
    def _origin(obj: Any) -> str:
        try:
            return f"{obj.__module__} ({inspect.getsourcefile(obj)})"
        except TypeError:
            return str(obj.__module__)

    # -- one class or function --------------------------------------------------------------
    def _source_of(self, obj: Any) -> tuple[str, ast.stmt]:
        kind = "class" if inspect.isclass(obj) else "function"
        try:
            source = textwrap.dedent(inspect.getsource(obj))
            tree = ast.parse(source)
        except (OSError, TypeError, SyntaxError) as exc:
            raise _refuse(
                f"cannot read the source code of {kind} {obj.__qualname__} "
                f"(module {obj.__module__}): {exc}. A callback sent to a training job is "
                "carried as source code: define it in a .py file (your script or the model "
                "file), not in an interactive session or with exec()"
            ) from None
        node = tree.body[0] if tree.body else None
        if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            raise _refuse(f"the source of {kind} {obj.__qualname__} is not a def/class statement")
        return source, node

    def _check_closure(self, function: types.FunctionType, owner: str) -> None:
        free = [name for name in function.__code__.co_freevars if name != "__class__"]
        if free:
            raise _refuse(
                f"{owner} uses {', '.join(map(repr, free))} from the function it is defined in "
                "(a closure), which cannot be sent to a training job: define the callback at "
                "the top level of a .py file and pass such values to __init__ as attributes"
            )

    def _ship(self, obj: Any, bound_name: str, used_by: str) -> None:
        if id(obj) in self.shipped:
            if bound_name != self.shipped[id(obj)]:
                self.aliases.append(f"{bound_name} = {self.shipped[id(obj)]}")
            return
        if inspect.isfunction(obj) and obj.__name__ == "<lambda>":
            raise _refuse(
                f"{used_by} uses {bound_name!r}, a lambda, which cannot be sent to a training "
                f"job: define it with def {bound_name}(...) at the top level of the file"
            )
        self.shipped[id(obj)] = obj.__name__
        source, node = self._source_of(obj)
        functions = _functions_of(obj) if inspect.isclass(obj) else [obj]
        # Only the code written in its source: methods generated by decorators (dataclass's
        # __init__, ...) are made again when the carried source runs.
        home_file = _normalized(inspect.getsourcefile(obj))
        functions = [f for f in functions if _normalized(f.__code__.co_filename) == home_file]
        for function in functions:
            self._check_closure(function, obj.__qualname__)
        names_visitor = _DefinitionNames()
        names_visitor.visit(node)
        names = names_visitor.loads - names_visitor.bound
        for function in functions:
            names |= _code_globals(function.__code__)
        module = sys.modules.get(obj.__module__)
        namespace = vars(module) if module is not None else functions[0].__globals__
        local_definition = "<locals>" in obj.__qualname__
        for name in sorted(names):
            self._resolve(name, namespace, obj.__qualname__, local_definition)
        self.blocks.append(source.rstrip())
        if bound_name != obj.__name__:
            self.aliases.append(f"{bound_name} = {obj.__name__}")

    # -- one global name ----------------------------------------------------------------------
    def _resolve(self, name: str, namespace: Mapping[str, Any], user: str, local: bool) -> None:
        if name in self.lines or name == "__class__":
            return
        if name not in namespace:
            if local and not hasattr(builtins, name):
                raise _refuse(
                    f"{user} uses {name!r}, a local name of the function it is defined in, "
                    "which cannot be sent to a training job: define the callback and what it "
                    "uses at the top level of a .py file"
                )
            return  # a builtin, or a name the code defines itself
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            if value.__name__ == "__main__":
                raise _refuse(f"{user} uses {name!r}, the __main__ module: use its names directly")
            # os.path is posixpath or ntpath depending on the client: name it portably.
            module = "os.path" if value is os.path else value.__name__
            self.lines[name] = [
                f"import {module}" if module == name else f"import {module} as {name}"
            ]
            return
        if (
            (inspect.isclass(value) or inspect.isfunction(value))
            and value.__module__ == self.home
            and not value.__module__.startswith("ace3.")
        ):
            self._ship(value, name, used_by=user)
            return
        path = _import_path(value)
        if path is not None:
            module, qualname = path
            head, _, rest = qualname.partition(".")
            lines = [f"from {module} import {head} as {name}"]
            if rest:
                lines.append(f"{name} = {name}.{rest}")
            self.lines[name] = lines
            return
        if _is_plain_constant(value):
            text = repr(value)
            if len(text) <= _MAX_CONSTANT_CHARS:
                self.lines[name] = [f"{name} = {text}"]
                return
        what = f"a {type(value).__module__}.{type(value).__qualname__}"
        if inspect.isfunction(value) and value.__name__ == "<lambda>":
            what = "a lambda"
        raise _refuse(
            f"{user} uses the global name {name!r} ({what}), which cannot be sent to a training "
            "job: only modules, importable classes and functions, classes and functions defined "
            "in the same file, and plain constants can; " + _MOVE_HINT
        )


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
