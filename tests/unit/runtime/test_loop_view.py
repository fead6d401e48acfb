"""The training loop owns its state: the engine's other modules see it through
:class:`ace3.runtime.loop.view.LoopView` and change it only through its operations, and the
view's module imports nothing of the loop (so no import cycle runs through the loop)."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

import ace3.runtime
from ace3.runtime.loop.loop import TrainingLoop
from ace3.runtime.loop.view import LoopView
from tests.loop_fakes import FakeLoop

RUNTIME = Path(ace3.runtime.__file__).parent
LOOP_MODULE = RUNTIME / "loop" / "loop.py"


def _through_loop(node: ast.AST) -> bool:
    """``loop.x``, ``loop.x.y``, ``loop.x[k]``, ``self.loop.x`` ...: an expression rooted at a
    name ``loop`` (or the attribute ``self.loop``) that goes at least one step into it."""
    steps = 0
    while isinstance(node, ast.Attribute | ast.Subscript):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "loop"
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            return steps > 0
        node = node.value
        steps += 1
    return steps > 0 and isinstance(node, ast.Name) and node.id == "loop"


def _is_loop(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "loop") or (
        isinstance(node, ast.Attribute)
        and node.attr == "loop"
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        found = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        found = [node.target]
    elif isinstance(node, ast.Delete):
        found = list(node.targets)
    else:
        return []
    flat: list[ast.AST] = []
    while found:
        target = found.pop()
        if isinstance(target, ast.Tuple | ast.List):
            found.extend(target.elts)
        elif isinstance(target, ast.Starred):
            found.append(target.value)
        else:
            flat.append(target)
    return flat


def writes_to_the_loop(source: str) -> list[int]:
    """The lines of ``source`` that assign (or delete) through a loop, or setattr on one."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if any(_through_loop(target) for target in _targets(node)):
            lines.append(node.lineno)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and _is_loop(node.args[0])
        ):
            lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("loop.window = None", [1]),
        ("loop.last_saved_step, x = 1, 2", [1]),
        ("self.loop.state.carry['k'] = [1.0]", [1]),
        ("loop.steps.lr_factor *= 2", [1]),
        ("setattr(loop, 'epoch_window', None)", [1]),
        ("del loop.stop_requested", [1]),
        ("loop = make()\nx = loop.state.step\nloop.log('a')", []),
        ("self.loop = loop\nwindow.loop = 3", []),
    ],
)
def test_the_check_finds_writes_through_a_loop(source: str, found: list[int]) -> None:
    assert writes_to_the_loop(source) == found


def test_nothing_outside_the_loop_module_assigns_loop_state() -> None:
    offenders = {
        str(path.relative_to(RUNTIME)): lines
        for path in sorted(RUNTIME.rglob("*.py"))
        if path != LOOP_MODULE and (lines := writes_to_the_loop(path.read_text()))
    }
    assert offenders == {}, "use a LoopView operation (ace3.runtime.loop.view) instead"


def _view_members() -> set[str]:
    return {
        name
        for name in vars(LoopView)
        if not name.startswith("_") and name not in ("register", "mro")
    } | set(getattr(LoopView, "__annotations__", {}))


def _loop_instance_attributes() -> set[str]:
    tree = ast.parse(LOOP_MODULE.read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and isinstance(node.ctx, ast.Store)
    }


def test_the_loop_and_the_fake_offer_every_member_of_the_view(tmp_path: Path) -> None:
    members = _view_members()
    assert {"state", "log", "roll_back_to", "save_checkpoint_now"} <= members
    on_loop = {name for name in members if hasattr(TrainingLoop, name)}
    assert members - on_loop - _loop_instance_attributes() == set()
    from ace3.runtime.loop.train_state import TrainState

    fake = FakeLoop(TrainState(), tmp_dir=tmp_path)
    missing = {name for name in members if name not in vars(FakeLoop) and name not in vars(fake)}
    assert missing == set()


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("ace3")  # (imports under TYPE_CHECKING count)


def test_the_view_and_what_takes_it_import_nothing_of_the_loop(graph: grimp.ImportGraph) -> None:
    loop = "ace3.runtime.loop.loop"
    assert loop not in graph.find_upstream_modules("ace3.runtime.loop.view")
    for module in sorted(graph.find_modules_directly_imported_by(loop)):
        if module.startswith("ace3."):
            assert not graph.chain_exists(importer=module, imported=loop), module
