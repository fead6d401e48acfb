"""How a callback class defined in your code becomes module source: its own source, what its
methods and class statement need from its file (imports, shipped definitions, constants),
or a refusal naming what cannot be carried (see :mod:`ace3.training.callbacks.transport`)."""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import math
import os
import sys
import textwrap
import types
from collections.abc import Mapping
from typing import Any

from ace3.training.callbacks.values import MOVE_HINT, refuse

__all__ = ["SourceCollector"]

_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME"})
_MAX_CONSTANT_CHARS = 100_000


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


class SourceCollector:
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
            raise refuse(
                f"cannot read the source code of {kind} {obj.__qualname__} "
                f"(module {obj.__module__}): {exc}. A callback sent to a training job is "
                "carried as source code: define it in a .py file (your script or the model "
                "file), not in an interactive session or with exec()"
            ) from None
        node = tree.body[0] if tree.body else None
        if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            raise refuse(f"the source of {kind} {obj.__qualname__} is not a def/class statement")
        return source, node

    def _check_closure(self, function: types.FunctionType, owner: str) -> None:
        free = [name for name in function.__code__.co_freevars if name != "__class__"]
        if free:
            raise refuse(
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
            raise refuse(
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
                raise refuse(
                    f"{user} uses {name!r}, a local name of the function it is defined in, "
                    "which cannot be sent to a training job: define the callback and what it "
                    "uses at the top level of a .py file"
                )
            return  # a builtin, or a name the code defines itself
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            if value.__name__ == "__main__":
                raise refuse(f"{user} uses {name!r}, the __main__ module: use its names directly")
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
        raise refuse(
            f"{user} uses the global name {name!r} ({what}), which cannot be sent to a training "
            "job: only modules, importable classes and functions, classes and functions defined "
            "in the same file, and plain constants can; " + MOVE_HINT
        )
