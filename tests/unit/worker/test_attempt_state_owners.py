"""Each part of a running attempt's state is written by the one module that owns it: what the
job's output told the worker (``JobOutput``) by the ingest, the run's lease, timers and reasons
to stop (``RunState``) by the watch loop; the outcome, the membership and the supervisor only
read them (issue 26, item 1)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from ace3_worker.ingest import JobOutput
from ace3_worker.watch import AttemptWatch, RunState

WORKER = Path(__file__).resolve().parents[3] / "workers" / "ace3_worker"
# part of AttemptWatch -> (its class, the one module that writes it)
OWNERS = {"output": (JobOutput, "ingest.py"), "run": (RunState, "watch.py")}
MUTATORS = {"append", "appendleft", "extend", "add", "clear", "pop", "remove", "update", "discard"}


def _written_part(node: ast.AST) -> tuple[str, str] | None:
    """(part, field) when ``node`` is ``<anything>.<part>.<field>`` for an owned part."""
    if not isinstance(node, ast.Attribute) or not isinstance(node.value, ast.Attribute):
        return None
    part = node.value.attr
    if part in OWNERS and node.attr in {f.name for f in dataclasses.fields(OWNERS[part][0])}:
        return part, node.attr
    return None


def _writes(tree: ast.AST) -> list[tuple[int, str, str]]:
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt | ast.expr):
            continue
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        for target in targets:
            if isinstance(target, ast.Subscript):
                target = target.value
            written = _written_part(target)
            if written is not None:
                found.append((node.lineno, *written))
    return found


def test_no_module_writes_a_part_of_the_attempt_it_does_not_own() -> None:
    trespasses = []
    for path in sorted(WORKER.rglob("*.py")):
        for line, part, name in _writes(ast.parse(path.read_text(), str(path))):
            if path.name != OWNERS[part][1]:
                trespasses.append(f"{path.relative_to(WORKER)}:{line} writes {part}.{name}")
    assert not trespasses, trespasses


def test_the_check_sees_a_write_from_outside() -> None:
    source = "watch.run.lease_lost = True\nwatch.output.pending_lines += []\n"
    source += "watch.output.staged_checkpoints.add('x')\nwatch.run.stopping\n"
    assert [(p, n) for _, p, n in _writes(ast.parse(source))] == [
        ("run", "lease_lost"),
        ("output", "pending_lines"),
        ("output", "staged_checkpoints"),
    ]


def test_the_parts_themselves_cannot_be_replaced() -> None:
    watch = AttemptWatch("job", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        watch.run = RunState()  # type: ignore[misc]
