"""The ACE3 document's code snippets, as written, and how the suite runs them.

:func:`document_snippets` reads every ```python block of the ACE3 document
(``ace3_document.md``, a copy of ``../shared/seeds/000_*.txt``) with the heading it sits under.
:func:`run_snippet` fills the document's placeholders (an API key, file paths) — checking that
each one is really in the snippet, so nothing else can change — writes the result to a file
and runs it as ``__main__`` with the names earlier sections of the document defined
(``model``, ``dataset``, ``optimizer``, ...), and returns its globals.
"""

from __future__ import annotations

import re
import runpy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
# The document as the SDK contract fixed it, kept with the suite so a clone can run it alone;
# test_coverage.py checks it still matches the project's copy when that copy is present.
DOCUMENT = Path(__file__).with_name("ace3_document.md")
SEEDS = REPO_ROOT.parent / "shared" / "seeds"
FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)
HEADING = re.compile(r"^(#{2,4}) (.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Snippet:
    heading: str
    code: str


def document_path() -> Path:
    return DOCUMENT


def project_copy() -> Path | None:
    """The project's own copy of the document (``../shared/seeds/000_*.txt``), if present."""
    found = sorted(SEEDS.glob("000_*.txt")) if SEEDS.is_dir() else []
    return found[0] if found else None


def document_snippets() -> dict[str, Snippet]:
    """heading -> snippet, in document order; one snippet per heading."""
    text = document_path().read_text(encoding="utf-8")
    headings = [(m.start(), m.group(2).strip()) for m in HEADING.finditer(text)]
    snippets: dict[str, Snippet] = {}
    for match in FENCE.finditer(text):
        heading = [title for start, title in headings if start < match.start()][-1]
        assert heading not in snippets, f"two snippets under {heading!r}"
        snippets[heading] = Snippet(heading, match.group(1))
    return snippets


def fill(code: str, placeholders: dict[str, str]) -> str:
    """Replace each placeholder (it must occur in ``code``)."""
    for placeholder, value in placeholders.items():
        assert placeholder in code, f"placeholder {placeholder!r} is not in the snippet"
        code = code.replace(placeholder, value)
    return code


def run_snippet(
    heading: str,
    directory: Path,
    namespace: dict[str, Any] | None = None,
    placeholders: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the snippet under ``heading`` as a script in ``directory``; return its globals."""
    snippet = document_snippets()[heading]
    code = fill(snippet.code, placeholders or {})
    slug = re.sub(r"[^a-z0-9]+", "_", heading.lower()).strip("_")
    script = directory / f"snippet_{slug}.py"
    script.write_text(code, encoding="utf-8")
    return runpy.run_path(str(script), init_globals=dict(namespace or {}), run_name="__main__")
