"""Every ``ace3`` name the README shows resolves as written (``ace3.callbacks.EarlyStopping``:
attribute access from ``import ace3``), and every dotted ``ace3`` name in docs/ points at
something that exists, so that a move inside the package cannot leave the docs behind."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

import ace3

ROOT = Path(__file__).resolve().parents[2]
DOTTED = re.compile(r"(?<![\w./])ace3(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
NOT_PYTHON = {"ace3.run_job"}  # the Celery task's name


def _names(path: Path) -> list[str]:
    found = sorted(set(DOTTED.findall(path.read_text())))
    return [name for name in found if name not in NOT_PYTHON]


def _attribute_chain(dotted: str) -> Any:
    value: Any = ace3
    for part in dotted.split(".")[1:]:
        value = getattr(value, part)
    return value


def _resolve(dotted: str) -> Any:
    """The longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            value = getattr(value, part)
        return value
    raise ImportError(dotted)


README_NAMES = _names(ROOT / "README.md")
DOC_NAMES = sorted(
    {(doc.name, name) for doc in (ROOT / "docs").glob("*.md") for name in _names(doc)}
)


def test_the_readme_shows_names_to_check():
    assert {"ace3.Client", "ace3.TrainingConfig", "ace3.callbacks.EarlyStopping"} <= set(
        README_NAMES
    )


@pytest.mark.parametrize("dotted", README_NAMES)
def test_every_readme_name_resolves_from_import_ace3(dotted: str) -> None:
    _attribute_chain(dotted)


@pytest.mark.parametrize(("doc", "dotted"), DOC_NAMES)
def test_every_dotted_name_in_the_docs_exists(doc: str, dotted: str) -> None:
    try:
        _resolve(dotted)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"docs/{doc} names {dotted}, which does not exist: {exc}")


def test_every_public_name_of_ace3_resolves() -> None:
    for name in [*ace3.__all__, *ace3._LAZY]:
        assert getattr(ace3, name) is not None, name
