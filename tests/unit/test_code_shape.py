"""The shape of the code, checked: no import cycle among the project's modules and no module
over 400 lines.

An import cycle is counted as Python's import system would meet it at some point: imports inside
functions and under ``if TYPE_CHECKING:`` count too (grimp records both), because a cycle that is
only lazy today is one refactoring away from an ``ImportError`` at start-up, and a type-only
cycle still ties the modules' designs together. A package's ``__init__`` counts as a module: a
submodule that imports a name back from its own package's ``__init__`` (which imports the
submodule) closes a cycle."""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ace3", "ace3_control", "ace3_server", "ace3_worker")
SOURCE_DIRS = ("sdk", "server", "workers", "control")
MAX_LINES = 400


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm, iterative: every set of two or more modules that import each other
    (directly or through one another)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph.modules):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, sorted(graph.find_modules_directly_imported_by(start))))
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.find_modules_directly_imported_by(nxt))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def one_cycle(graph: grimp.ImportGraph, component: list[str]) -> str:
    """One concrete loop inside a component, for the failure message."""
    first, members = component[0], set(component)
    for other in component[1:]:
        there = graph.find_shortest_chain(importer=first, imported=other)
        back = graph.find_shortest_chain(importer=other, imported=first)
        if there and back and set(there) | set(back) <= members:
            return " -> ".join([*there, *back[1:]])
    return ", ".join(component)


def test_no_import_cycle_among_the_project_modules() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    cycles = strongly_connected(graph)
    assert not cycles, "import cycles:\n" + "\n".join(
        f"  {len(c)} modules: {one_cycle(graph, c)}" for c in cycles
    )


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    graph.add_import(importer="pkg", imported="pkg.a")
    assert strongly_connected(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert one_cycle(graph, ["pkg.a", "pkg.b", "pkg.c"]) == "pkg.a -> pkg.b -> pkg.c -> pkg.a"


def test_no_module_over_the_line_limit() -> None:
    too_long = {}
    for directory in SOURCE_DIRS:
        for path in sorted((ROOT / directory).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                too_long[str(path.relative_to(ROOT))] = lines
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"
