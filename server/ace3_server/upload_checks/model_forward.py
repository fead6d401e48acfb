"""What a model's ``forward`` takes, read from the source with ``ast`` (never imported), so that a
job pairing it with a dataset whose batches it cannot take is refused at submission.

The engine calls ``model(inputs)`` for ``(inputs, targets)`` batches and ``model(**batch)`` for
dict batches, unless the model module defines ``compute_loss(model, batch)``
(:mod:`ace3.runtime.loop.losses`). The signature is recorded only where it is certain:

- the module binds no ``compute_loss`` (and nothing it does could bind names unseen);
- the factory is a module-level ``def`` (or ``class``) bound once, and every ``return`` in it
  gives an instance of one module-level class bound once: ``return Net(...)``, or ``return
  model`` where ``model = Net(...)`` is the function's only binding of that name;
- that class and every class up its chain of module-level single bases is plain (its body
  holds only a docstring, assignments of names other than ``forward``/``__call__``, and
  undecorated methods, none of them a dunder other than ``__init__``; no decorator, keyword or
  metaclass), one of them defines ``forward``, and the chain ends at ``nn.Module`` or
  ``nn.Sequential`` (whose ``forward(input)`` takes one positional argument; the factory may
  also return an ``nn.Sequential`` itself);
- nothing in the module could change what ``model(...)`` runs or which names are bound: no
  module-level call (``patch(Net)``), no ``setattr``, ``__dict__``, ``__class__``,
  ``sys.modules``, hook registration (``register_forward_pre_hook``), ``global``/``nonlocal``,
  walrus or ``match`` anywhere, no attribute ``forward``/``__call__`` assigned, no star import.

Anything else (a base from another package, such as a ``PreTrainedModel``, a factory that
returns ``Net().to(...)``, a class imported from another module) records nothing, and nothing
is checked.
"""

from __future__ import annotations

import ast
from typing import Any

from ace3_server.upload_checks.model_source import bound_names, module_statements, target_names

_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names and attributes (iteratively: any depth), else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _own_nodes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
    """The nodes of ``function``'s body outside nested functions, classes and lambdas."""
    found: list[ast.AST] = []
    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        found.append(node)
        if not isinstance(node, _NESTED_SCOPES):
            pending.extend(ast.iter_child_nodes(node))
    return found


SEQUENTIAL = "torch.nn.Sequential"
"""The one library class recorded: its ``forward(self, input)`` runs the modules in turn."""
_SEQUENTIAL_FORWARD = {
    "method": "nn.Sequential.forward",
    "params": [{"name": "input", "kind": "positional", "required": True}],
    "var_positional": False,
    "var_keyword": False,
}


def _torch_nn_class(node: ast.expr, bound: dict[str, list[ast.stmt]]) -> str | None:
    """``torch.nn.X`` for ``node`` spelling ``torch.nn.X``, ``nn.X`` or ``X`` where the module
    binds that first name only by importing it from torch (``import torch``, ``from torch import
    nn``, ``import torch.nn as nn``, ``from torch.nn import X``)."""
    dotted = _dotted(node)
    if dotted is None:
        return None
    head, _, rest = dotted.partition(".")
    statements = bound.get(head, [])
    if len(statements) != 1 or not isinstance(statements[0], (ast.Import, ast.ImportFrom)):
        return None
    statement = statements[0]
    alias = next(a for a in statement.names if (a.asname or a.name.split(".")[0]) == head)
    if isinstance(statement, ast.ImportFrom):
        source = f"{statement.module}.{alias.name}" if statement.level == 0 else None
    else:
        source = alias.name if alias.asname else head
    full = f"{source}.{rest}" if rest else source
    return full if full is not None and full.startswith("torch.nn.") else None


class _Scope:
    """The module's names: its classes bound once, and every module-level binding."""

    def __init__(self, bound: dict[str, list[ast.stmt]]) -> None:
        self.bound = bound
        self.classes = {
            name: only[0]
            for name, only in bound.items()
            if len(only) == 1 and isinstance(only[0], ast.ClassDef)
        }

    def class_of(self, node: ast.expr, local: set[str]) -> str | None:
        """A module-level class name or :data:`SEQUENTIAL` for a class expression, unless a
        local name shadows it."""
        dotted = _dotted(node)
        if dotted is None or dotted.split(".")[0] in local:
            return None
        if dotted in self.classes:
            return dotted
        return SEQUENTIAL if self.torch_nn(node) == SEQUENTIAL else None

    def torch_nn(self, node: ast.expr) -> str | None:
        return _torch_nn_class(node, self.bound)


def _parameter_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = function.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    return names


def _local_bindings(nodes: list[ast.AST]) -> dict[str, list[ast.AST]]:
    """Each name a function's own nodes bind, with the nodes that bind it (a ``global`` or
    ``nonlocal`` counts twice: never a single binding)."""
    bindings: dict[str, list[ast.AST]] = {}
    for node in nodes:
        names: list[str] = []
        if isinstance(node, ast.Assign):
            names = [n for target in node.targets for n in target_names(target)]
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr, ast.For, ast.AsyncFor)):
            names = list(target_names(node.target))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            names = list(target_names(node.optional_vars))
        elif isinstance(node, ast.Delete):
            names = [n for target in node.targets for n in target_names(target)]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.asname or a.name.split(".")[0] for a in node.names]
        elif (isinstance(node, ast.ExceptHandler) and node.name) or (
            isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name
        ):
            names = [node.name]
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names = [*node.names, *node.names]
        for name in names:
            bindings.setdefault(name, []).append(node)
    return bindings


def _returned_class(function: ast.FunctionDef, scope: _Scope) -> str | None:
    """The one class every ``return`` of ``function`` instantiates, else None."""
    nodes = _own_nodes(function)
    if any(isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)) for node in nodes):
        return None
    returns = [node for node in nodes if isinstance(node, ast.Return)]
    bindings = _local_bindings(nodes)
    local = set(bindings) | _parameter_names(function)
    names = set()
    for returned in returns:
        value = returned.value
        if isinstance(value, ast.Name):
            bound = bindings.get(value.id, [])
            if len(bound) != 1 or not isinstance(bound[0], ast.Assign):
                return None
            assignment = bound[0]
            if len(assignment.targets) != 1 or not isinstance(assignment.targets[0], ast.Name):
                return None
            value = assignment.value
        if not isinstance(value, ast.Call):
            return None
        class_name = scope.class_of(value.func, local)
        if class_name is None:
            return None
        names.add(class_name)
    return names.pop() if len(names) == 1 else None


def _plain_class(class_def: ast.ClassDef) -> ast.FunctionDef | bool:
    """A plain class's ``def forward`` (True when it has none); False when the class is not
    plain (see the module docstring)."""
    if class_def.decorator_list or class_def.keywords:
        return False
    forward: ast.FunctionDef | bool = True
    for index, statement in enumerate(class_def.body):
        if isinstance(statement, ast.Expr) and index == 0:
            continue  # (the docstring)
        if isinstance(statement, ast.FunctionDef):
            name = statement.name
            if statement.decorator_list and name == "forward":
                return False
            if name.startswith("__") and name.endswith("__") and name != "__init__":
                return False
            if name == "forward":
                if forward is not True:
                    return False
                forward = statement
            continue
        if isinstance(statement, (ast.Assign, ast.AnnAssign)):
            names = list(bound_names(statement))
            if "forward" in names or any(n.startswith("__") for n in names):
                return False
            continue
        if isinstance(statement, ast.Pass):
            continue
        return False  # (a nested block, an async def, an import, ...)
    return forward


def _forward_of(class_name: str, scope: _Scope) -> dict[str, Any] | None:
    """The signature of the ``forward`` on ``class_name``'s chain of single bases, when every
    class on it is plain and it ends at nn.Module or nn.Sequential; else None."""
    seen: set[str] = set()
    current = class_name
    found: dict[str, Any] | None = None
    while current != SEQUENTIAL:
        if current in seen:
            return None
        seen.add(current)
        class_def = scope.classes[current]
        forward = _plain_class(class_def)
        if forward is False:
            return None
        if found is None and isinstance(forward, ast.FunctionDef):
            found = _parameters(forward)
            if found is None:
                return None
            found = {"method": f"{current}.forward", **found}
        if len(class_def.bases) != 1:
            return None
        base = class_def.bases[0]
        if scope.torch_nn(base) == "torch.nn.Module":
            return found
        following = scope.class_of(base, set())
        if following is None:
            return None  # a library's class, other than nn.Sequential
        current = following
    return found if found is not None else dict(_SEQUENTIAL_FORWARD)


_DYNAMIC_CALLS = frozenset({"setattr", "delattr", "globals", "vars", "exec", "eval", "locals"})
_DYNAMIC_ATTRIBUTES = frozenset({"__dict__", "__class__", "__setattr__", "_call_impl"})


def _dynamic(tree: ast.Module) -> bool:
    """Anything that could change which names are bound or what ``model(...)`` runs, unseen by
    the analysis (see the module docstring)."""
    for statement in tree.body:
        if isinstance(statement, (*_NESTED_SCOPES, ast.Import, ast.ImportFrom)):
            continue
        if any(isinstance(node, ast.Call) for node in ast.walk(statement)):
            return True  # a module-level call: patch(Net), _install(), ...
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal, ast.NamedExpr, ast.Match)):
            return True
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__getattr__":
            return True
        if isinstance(node, ast.Call) and _dotted(node.func) in _DYNAMIC_CALLS:
            return True
        if isinstance(node, ast.Attribute) and _dynamic_attribute(node):
            return True
    return False


def _dynamic_attribute(node: ast.Attribute) -> bool:
    if node.attr in ("forward", "__call__") and isinstance(node.ctx, ast.Store):
        return True
    if node.attr in _DYNAMIC_ATTRIBUTES:
        return True  # obj.__dict__[...] = ..., type.__setattr__(...), model.__class__ = ...
    if node.attr == "modules" and _dotted(node.value) == "sys":
        return True
    return node.attr.startswith("register_") and node.attr.endswith("hook")


def _parameters(forward: ast.FunctionDef) -> dict[str, Any] | None:
    args = forward.args
    positional = [*args.posonlyargs, *args.args]
    if not positional:
        return None  # no self: not a method the engine can call as written
    first_default = len(positional) - len(args.defaults)
    params: list[dict[str, Any]] = []
    for index, arg in enumerate(positional[1:], start=1):
        kind = "positional_only" if index < len(args.posonlyargs) else "positional"
        params.append({"name": arg.arg, "kind": kind, "required": index < first_default})
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append({"name": arg.arg, "kind": "keyword_only", "required": default is None})
    return {
        "params": params,
        "var_positional": args.vararg is not None,
        "var_keyword": args.kwarg is not None,
    }


def forward_signature(tree: ast.Module, factory: str) -> dict[str, Any] | None:
    """``{"method": "Net.forward", "params": [...], "var_positional", "var_keyword"}`` for the
    model ``factory`` builds, when certain (see the module docstring); None otherwise (also for
    a tree too deep to walk)."""
    try:
        return _signature(tree, factory)
    except (RecursionError, MemoryError):
        return None


def _signature(tree: ast.Module, factory: str) -> dict[str, Any] | None:
    if _dynamic(tree):
        return None
    bound: dict[str, list[ast.stmt]] = {}
    for statement in module_statements(tree.body):
        for name in bound_names(statement):
            bound.setdefault(name, []).append(statement)
    if "compute_loss" in bound:
        return None
    scope = _Scope(bound)
    built = bound.get(factory, [])
    if len(built) != 1:
        return None
    if isinstance(built[0], ast.ClassDef):
        class_name: str | None = factory if factory in scope.classes else None
    elif isinstance(built[0], ast.FunctionDef) and not built[0].decorator_list:
        class_name = _returned_class(built[0], scope)
    else:
        return None
    return None if class_name is None else _forward_of(class_name, scope)
