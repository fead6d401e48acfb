"""The GPU checks' summary (scripts/gpu-check.sh): one line per check of pytest's JUnit XML report,
passed, skipped with its reason, or failed with the first line of its error; then the counts.

Usage: python scripts/gpu_check_summary.py JUNIT_XML
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path


def check_id(classname: str, name: str) -> str:
    """``tests/gpu/test_x.py::test_y[param]`` (pytest's id) from JUnit's dotted class name."""
    return f"{classname.replace('.', '/')}.py::{name}"


def first_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def outcomes(report: Path) -> list[tuple[str, str, str]]:
    """(outcome, check id, reason) for every test case of ``report``."""
    found = []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        check = check_id(case.get("classname", ""), case.get("name", ""))
        outcome, reason = "passed", ""
        for child in case:
            if child.tag == "skipped":
                outcome, reason = "skipped", first_line(child.get("message"))
            elif child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
                reason = first_line(child.get("message")) or first_line(child.text)
                break
        found.append((outcome, check, reason))
    return found


def summary(report: Path) -> tuple[str, bool]:
    """The summary's text, and whether no check failed."""
    results = outcomes(report)
    lines = [
        f"{outcome.upper():8} {check}" + (f": {reason}" if reason else "")
        for outcome, check, reason in results
    ]
    counts = Counter(outcome for outcome, _, _ in results)
    bad = counts["failed"] + counts["error"]
    lines.append(f"gpu-check: {counts['passed']} passed, {bad} failed, {counts['skipped']} skipped")
    return "\n".join(lines), bad == 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    text, _ = summary(Path(argv[1]))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
