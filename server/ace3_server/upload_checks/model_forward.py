"""What a model's ``forward`` takes, read from the source with ``ast`` (never imported), so that a
job pairing it with a dataset whose batches it cannot take is refused at submission.

The engine calls ``model(inputs)`` for ``(inputs, targets)`` batches and ``model(**batch)`` for
dict batches, unless the model module defines ``compute_loss(model, batch)``
(:mod:`ace3.runtime.loop.losses`). The signature is recorded only where it is certain:

- the module binds no ``compute_loss`` (and nothing it does could bind names unseen);
- the factory is a module-level ``def`` (or ``class``) bound once, and every ``return`` in it
  gives an instance of one module-level class bound once: ``return Net(...)``, or ``return
  model`` where ``model = Net(...)`` is the function's only binding of that name;
- that class, or the first class up its chain of module-level single bases, defines
  ``forward`` as a plain undecorated method, and no class on the way defines ``__call__``,
  assigns ``forward``, uses a metaclass or a decorator; or the chain (or the factory itself)
  reaches ``torch.nn.Sequential``, whose ``forward(input)`` takes one positional argument;
- nothing in the module assigns an attribute ``forward`` or ``__call__``.

Anything else (a base from another package, such as a ``PreTrainedModel``, a factory that
returns ``Net().to(...)``, a class imported from another module) records nothing, and nothing
is checked.
"""

from __future__ import annotations

import ast
from typing import Any

from ace3_server.upload_checks.model_source import (
    bound_names,
    may_bind_unseen_names,
    module_statements,
    target_names,
)

_NESTED_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


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


def _plain_method(class_def: ast.ClassDef, name: str) -> ast.FunctionDef | bool | None:
    """The class body's plain ``def name``; None when the body does not bind ``name``; False
    when it binds it some other way (an assignment, a decorator, ``async def``)."""
    found: ast.FunctionDef | bool | None = None
    for statement in class_def.body:
        if name not in bound_names(statement):
            continue
        if found is not None or not isinstance(statement, ast.FunctionDef):
            return False
        if statement.decorator_list:
            return False
        found = statement
    return found


def _forward_of(class_name: str, scope: _Scope) -> dict[str, Any] | None:
    """The signature of the ``forward`` up ``class_name``'s chain of single bases, else None."""
    seen: set[str] = set()
    current = class_name
    while current not in seen and current != SEQUENTIAL:
        seen.add(current)
        class_def = scope.classes[current]
        if class_def.decorator_list or class_def.keywords:
            return None
        if _plain_method(class_def, "__call__") is not None:
            return None
        forward = _plain_method(class_def, "forward")
        if forward is False:
            return None
        if isinstance(forward, ast.FunctionDef):
            signature = _parameters(forward)
            return None if signature is None else {"method": f"{current}.forward", **signature}
        if len(class_def.bases) != 1:
            return None
        base = scope.class_of(class_def.bases[0], set())
        if base is None:  # nn.Module's own forward raises (the engine says so), or a library's
            return None
        current = base
    return dict(_SEQUENTIAL_FORWARD) if current == SEQUENTIAL else None


def _patches_forward(tree: ast.Module) -> bool:
    """Anything in the module assigns an attribute ``forward`` or ``__call__`` (``self.forward
    = ...`` in ``__init__``, ``Net.forward = ...``): the class's own def may not be what runs."""
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for element in ast.walk(target):
                if isinstance(element, ast.Attribute) and element.attr in ("forward", "__call__"):
                    return True
    return False


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
    model ``factory`` builds, when certain (see the module docstring); None otherwise."""
    statements = list(module_statements(tree.body))
    if may_bind_unseen_names(statements) or _patches_forward(tree):
        return None
    bound: dict[str, list[ast.stmt]] = {}
    for statement in statements:
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
