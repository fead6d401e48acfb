"""Every ``# type: ignore`` in the project's packages names its error code and gives its reason
(docs/architecture.md): mypy checks that the code is there (``ignore-without-code``) and that
the comment still silences something (``warn_unused_ignores``); this test that a reason follows
it, as ``# type: ignore[code]  # why``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sdk/ace3", "control/ace3_control", "server/ace3_server", "workers/ace3_worker")
IGNORE = re.compile(r"#\s*type:\s*ignore(?P<rest>.*)$")
CODES_THEN_REASON = re.compile(r"\[[a-z-]+(?:, ?[a-z-]+)*\]  # \S")


def ignores_without_reason(text: str) -> list[int]:
    """The line numbers of ``text`` whose type: ignore lacks its codes or its reason."""
    return [
        number
        for number, line in enumerate(text.splitlines(), 1)
        if (found := IGNORE.search(line)) and not CODES_THEN_REASON.match(found.group("rest"))
    ]


def test_the_rule_tells_a_reasoned_ignore_from_a_bare_one() -> None:
    text = (
        "a = 1  # type: ignore[attr-defined]  # torch's stubs lack it\n"
        "b = 2  # type: ignore[attr-defined]\n"
        "c = 3  # type: ignore\n"
        "d = 4  # type: ignore[arg-type,union-attr]  # set by wrap()\n"
    )
    assert ignores_without_reason(text) == [2, 3]


def test_every_type_ignore_names_its_code_and_reason() -> None:
    bare = [
        f"{path.relative_to(ROOT)}:{number}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for number in ignores_without_reason(path.read_text())
    ]
    assert not bare, "write `# type: ignore[code]  # reason` at:\n" + "\n".join(bare)
