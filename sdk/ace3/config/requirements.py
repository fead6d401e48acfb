"""The Python packages a job asks for: ``TrainingConfig.requirements`` and a model package's
``requirements.txt`` (docs/environments.md).

An entry is a PEP 508 requirement by name: ``"einops>=0.8"``, ``"torchvision==0.28.*"``,
``"timm[extra]"``, with an environment marker if need be. Everything that would bring bytes of
one owner's choosing into an environment every owner may share is refused with the entry and
the reason: direct URLs (``pkg @ https://...``, ``git+...``), local paths, ``-e`` and every
other pip option (``--index-url``, ``-r``, ``--find-links``). Where wheels come from is the
administrator's choice (``ACE3_PIP_*``), never a job's.

:func:`normalized_requirements` gives the one spelling an environment's identity is hashed
from: names canonical (PEP 503), extras sorted, specifiers sorted, entries sorted, duplicates
merged; the same package with two different version specifiers (or markers) is refused naming
both. Parsing uses :mod:`packaging` (pip's and uv's own reading of PEP 508).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (packaging is imported where an entry is read: `import ace3` stays light)
    from packaging.requirements import Requirement

MAX_REQUIREMENTS = 200
MAX_ENTRY_CHARS = 300


class RequirementError(ValueError):
    """An entry that cannot be part of a job's environment; the message names it."""

    def __init__(self, entry: str, reason: str, *, source: str = "requirements") -> None:
        self.entry = entry
        self.reason = reason
        self.source = source
        super().__init__(f"{source} entry {entry!r}: {reason}")


def _looks_like_path(entry: str) -> bool:
    return entry.startswith((".", "/", "~", "\\")) or entry.endswith((".whl", ".tar.gz", ".zip"))


def parse_requirement(entry: str, *, source: str = "requirements") -> Requirement:
    """One entry, parsed; a URL, a path, an option or anything not PEP 508 is refused."""
    text = entry.strip()
    if not text:
        raise RequirementError(entry, "is empty", source=source)
    if len(text) > MAX_ENTRY_CHARS:
        raise RequirementError(
            entry[:60] + "...", f"is longer than {MAX_ENTRY_CHARS} characters", source=source
        )
    if text.startswith("-"):
        raise RequirementError(
            entry,
            "pip options (-e, -r, --index-url, --find-links, ...) are not accepted: where "
            "packages come from is the service's setting (ACE3_PIP_INDEX_URL and others)",
            source=source,
        )
    if " --" in text or "\t--" in text:
        raise RequirementError(
            entry,
            "per-requirement options (--hash, --config-settings, ...) are not accepted: list "
            "the pins alone (pip-compile or uv pip compile without hashes); the service builds "
            "from wheels of its own index only",
            source=source,
        )
    if "://" in text or text.startswith(("git+", "hg+", "svn+", "bzr+")):
        raise RequirementError(
            entry,
            "direct URLs are not accepted: name the package and its version (e.g. "
            "'einops>=0.8'); the service installs from its own package index",
            source=source,
        )
    if _looks_like_path(text):
        raise RequirementError(
            entry,
            "local paths and archive files are not accepted: name the package and its "
            "version; publish your own package to the index the service uses",
            source=source,
        )
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise RequirementError(
            entry, f"is not a PEP 508 requirement ({str(exc).splitlines()[0]})", source=source
        ) from None
    if requirement.url is not None:
        raise RequirementError(
            entry, "direct references (name @ url) are not accepted", source=source
        )
    return requirement


@dataclass(frozen=True)
class _Named:
    requirement: Requirement
    entry: str
    source: str


def _canonical(requirement: Requirement, extras: Iterable[str]) -> str:
    from packaging.utils import canonicalize_name

    name = canonicalize_name(requirement.name)
    extra = f"[{','.join(sorted(set(extras)))}]" if extras else ""
    specifier = ",".join(sorted(str(s) for s in requirement.specifier))
    marker = f"; {requirement.marker}" if requirement.marker is not None else ""
    return f"{name}{extra}{specifier}{marker}"


def normalized_requirements(*sources: tuple[str, Iterable[str]]) -> list[str]:
    """Every entry of every ``(source name, entries)``, in one canonical, sorted spelling; the
    same package with two different specifiers or markers is refused naming both entries."""
    from packaging.utils import canonicalize_name

    by_name: dict[str, _Named] = {}
    extras: dict[str, set[str]] = {}
    count = 0
    for source, entries in sources:
        for entry in entries:
            count += 1
            if count > MAX_REQUIREMENTS:
                raise RequirementError(
                    entry, f"more than {MAX_REQUIREMENTS} requirements in all", source=source
                )
            requirement = parse_requirement(entry, source=source)
            name = canonicalize_name(requirement.name)
            earlier = by_name.get(name)
            if earlier is not None and (
                earlier.requirement.specifier != requirement.specifier
                or str(earlier.requirement.marker) != str(requirement.marker)
            ):
                raise RequirementError(
                    entry,
                    f"asks for {name} differently from {earlier.source} entry "
                    f"{earlier.entry!r}: keep one specifier per package",
                    source=source,
                )
            if earlier is None:
                by_name[name] = _Named(requirement, entry, source)
            extras.setdefault(name, set()).update(requirement.extras)
    return sorted(_canonical(named.requirement, extras[name]) for name, named in by_name.items())


def read_requirements_txt(text: str, *, source: str = "requirements.txt") -> list[str]:
    """The entries of a ``requirements.txt``: comments, blank lines and backslash
    continuations as pip reads them; an option line (``-r``, ``-e``, ``--index-url``) or a URL
    is refused naming the line."""
    entries: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = pending + raw
        pending = ""
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1]
            continue
        # A comment starts at '#' at the line's start or after whitespace (pip's rule).
        if line.lstrip().startswith("#"):
            continue
        for marker in (" #", "\t#"):
            if marker in line:
                line = line[: line.index(marker)]
        line = line.strip()
        if line:
            parse_requirement(line, source=source)
            entries.append(line)
    if pending.strip():
        parse_requirement(pending.strip(), source=source)
        entries.append(pending.strip())
    return entries


def unmet_requirements(entries: Iterable[str]) -> list[str]:
    """For a job that runs in this Python (``ace3.Trainer``): each entry this environment does
    not satisfy, with why (not installed, or the installed version); nothing is installed."""
    problems = []
    for entry in entries:
        requirement = parse_requirement(entry)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{requirement.name} is not installed (asked for {entry!r})")
            continue
        if requirement.specifier and not requirement.specifier.contains(
            installed, prereleases=True
        ):
            problems.append(
                f"{requirement.name} {installed} is installed; {entry!r} asks for another version"
            )
    return problems
