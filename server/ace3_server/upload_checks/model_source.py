"""Does a model module define its factory? Read from the source with ``ast``, never imported.

The engine imports the module and looks the factory up by name (``build_model`` unless the
upload names another): a module that binds no such name at module level fails every job 5-12 s
in. A name counts as defined when any module-level statement binds it, including those nested
in module-level ``if``/``try``/``with``/``for``/``while`` blocks (a fallback import is common):
``def``, ``async def``, ``class``, an assignment or annotated assignment with a value, an
augmented assignment, ``import x as name``, ``from x import name`` (or ``... as name``), a
``for`` target, a walrus. A module that could bind names the parser cannot see (``from x
import *``, a module ``__getattr__``, writing to ``globals()``) is given the benefit of the
doubt: only a certain failure is refused.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator

from ace3_server.upload_checks.errors import UploadCheckError

_BLOCKS = (ast.If, ast.Try, ast.TryStar, ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While)


def module_statements(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement that runs at module level: ``body`` and the blocks nested in it, but not
    function or class bodies."""
    for statement in body:
        yield statement
        if isinstance(statement, _BLOCKS):
            for field in ("body", "orelse", "finalbody"):
                yield from module_statements(getattr(statement, field, []))
            for handler in getattr(statement, "handlers", []):
                yield from module_statements(handler.body)
        elif isinstance(statement, ast.Match):
            for case in statement.cases:
                yield from module_statements(case.body)


def target_names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from target_names(element)
    elif isinstance(target, ast.Starred):
        yield from target_names(target.value)


def bound_names(statement: ast.stmt) -> Iterator[str]:
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield statement.name
    elif isinstance(statement, ast.Assign):
        for target in statement.targets:
            yield from target_names(target)
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        if not isinstance(statement, ast.AnnAssign) or statement.value is not None:
            yield from target_names(statement.target)
    elif isinstance(statement, (ast.For, ast.AsyncFor)):
        yield from target_names(statement.target)
    elif isinstance(statement, (ast.With, ast.AsyncWith)):
        for item in statement.items:
            if item.optional_vars is not None:
                yield from target_names(item.optional_vars)
    elif isinstance(statement, (ast.Import, ast.ImportFrom)):
        for alias in statement.names:
            yield alias.asname or alias.name.split(".")[0]
    for node in ast.walk(statement) if isinstance(statement, (ast.Expr, ast.Assign)) else ():
        if isinstance(node, ast.NamedExpr):
            yield from target_names(node.target)


def may_bind_unseen_names(statements: list[ast.stmt]) -> bool:
    """A star import, a module ``__getattr__`` (PEP 562) or a write through ``globals()`` /
    ``setattr`` may define the factory where the parser cannot see it."""
    for statement in statements:
        if isinstance(statement, ast.ImportFrom) and any(a.name == "*" for a in statement.names):
            return True
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if statement.name == "__getattr__":
                return True
            continue
        if isinstance(statement, ast.ClassDef):
            continue
        for node in ast.walk(statement):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("globals", "setattr", "exec", "vars")
            ):
                return True
    return False


def parse_module(source: bytes, display: str) -> ast.Module:
    """The module's syntax tree; :class:`UploadCheckError` when it does not parse (nesting
    deep enough to exhaust the parser included)."""
    try:
        return ast.parse(source, filename=display)
    except (SyntaxError, ValueError) as exc:
        raise UploadCheckError(f"{display} is not valid Python: {exc}") from exc
    except (RecursionError, MemoryError) as exc:
        raise UploadCheckError(
            f"{display} is not valid Python: it nests expressions too deeply for the parser"
        ) from exc


def check_defines_factory(tree: ast.Module, display: str, factory: str) -> None:
    """Refuse a module with no statements, or one that certainly binds no ``factory`` at module
    level; the message says what it looked for and what the module defines instead."""
    if not tree.body:
        raise UploadCheckError(
            f"{display} is empty (no statements, only whitespace or comments); a model file "
            f"defines {factory}"
        )
    statements = list(module_statements(tree.body))
    bound: list[str] = []
    for statement in statements:
        bound.extend(bound_names(statement))
    if factory in bound or may_bind_unseen_names(statements):
        return
    callables = sorted(
        {
            s.name
            for s in statements
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not s.name.startswith("_")
        }
    )
    found = ", ".join(callables[:20]) + (", ..." if len(callables) > 20 else "")
    hint = " (pass factory= to name another function or class)" if factory == "build_model" else ""
    raise UploadCheckError(
        f"{display} defines no {factory!r} at module level (looked for a def, class, assignment "
        f"or import of that name){hint}; functions and classes it defines: {found or 'none'}"
    )


def check_model_source(source: bytes, display: str, factory: str) -> ast.Module:
    """Parse ``source`` and check it defines ``factory`` (see the module docstring); the tree."""
    tree = parse_module(source, display)
    check_defines_factory(tree, display, factory)
    return tree
