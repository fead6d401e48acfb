"""The packages a job asks for, checked at submission (docs/environments.md).

A job's requirements are its ``config.requirements`` merged with its model package's
``requirements.txt`` (stored at upload, ``models.requirements``) into one canonical list
(:func:`ace3.config.requirements.normalized_requirements`), stored in ``jobs.requirements``; a
search's trials get their base config's merge the same way. What is refused, each a 422 entry in
the API's one shape naming the field, the entry and the reason:

- an entry that is not a PEP 508 requirement by name (URLs, paths, pip options), at
  ``config.requirements[i]``;
- the same package asked for two ways, naming both entries (the config's entry is blamed: the
  request is what the caller can change, the stored package is not);
- a requirement that would replace a package the live workers have installed (``torch==2.0.0``
  against their ``2.13.0+cpu``): an environment only adds packages. Checked against the sets the
  live workers advertise (``workers.packages``); none advertised, the job is accepted and the
  worker's resolver fails it with the same explanation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ace3.config.requirements import (
    RequirementError,
    normalized_requirements,
    parse_requirement,
    read_requirements_txt,
)

CONFIG_SOURCE = "config.requirements"
PACKAGE_SOURCE = "requirements.txt"


@dataclass
class RequirementsCheck:
    """The merged requirements (``[]``: none) and the 422 entries that refuse them."""

    merged: list[str] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)


def _loc(
    source: str, entry: str, config_entries: Sequence[str], loc: list[str | int]
) -> list[str | int]:
    """Where an entry came from: ``config.requirements[i]``, or the model (its requirements.txt)."""
    if source != CONFIG_SOURCE:
        return ["body", "model_id"]
    where: list[str | int] = [*loc, "requirements"]
    if entry in config_entries:
        where.append(list(config_entries).index(entry))
    return where


def _message(source: str, text: str) -> str:
    return f"the model package's {text}" if source == PACKAGE_SOURCE else text


def check_requirements(
    config_entries: Sequence[str],
    package_entries: Sequence[str] | None,
    loc: list[str | int],
    advertised: Sequence[dict[str, str]] = (),
) -> RequirementsCheck:
    """Merge a job's ``config.requirements`` (at ``loc``: the config's place in the body) with
    its model's stored ``requirements.txt``, and check the result against the installed sets the
    live workers ``advertised``."""
    sources = ((PACKAGE_SOURCE, list(package_entries or ())), (CONFIG_SOURCE, list(config_entries)))
    try:
        merged = normalized_requirements(*sources)
    except RequirementError as exc:
        return RequirementsCheck(
            problems=[
                {
                    "loc": _loc(exc.source, exc.entry, config_entries, loc),
                    "msg": _message(exc.source, str(exc)),
                    "type": "value_error",
                }
            ]
        )
    problems = []
    for source, entries in sources:
        for entry in entries:
            reason = replaced_package(parse_requirement(entry, source=source), advertised)
            if reason is not None:
                problems.append(
                    {
                        "loc": _loc(source, entry, config_entries, loc),
                        "msg": _message(source, f"{source} entry {entry!r}: {reason}"),
                        "type": "value_error",
                    }
                )
    return RequirementsCheck(merged=[] if problems else merged, problems=problems)


def replaced_package(requirement: Requirement, advertised: Sequence[dict[str, str]]) -> str | None:
    """Why ``requirement`` could only be met by replacing a package every advertising worker
    has installed (its specifier excludes each one's version); None when some worker can run it
    (it lacks the package, or its version fits), the marker is false, or none advertised."""
    if not advertised:
        return None
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        return None
    name = canonicalize_name(requirement.name)
    installed: set[str] = set()
    for packages in advertised:
        version = packages.get(name)
        if version is None:
            return None  # this worker's environment would add it
        try:
            parsed = Version(version)
        except InvalidVersion:
            return None  # a version packaging cannot read: the worker's resolver decides
        if requirement.specifier.contains(parsed, prereleases=True):
            return None
        installed.add(version)
    versions = ", ".join(sorted(installed))
    return (
        f"asks for {name}{requirement.specifier}, and the workers have {name} {versions} "
        f"installed: an environment only adds packages; it never replaces the worker's {name} "
        f"(leave {name} out, or ask for a specifier that {versions} meets)"
    )


MAX_REQUIREMENTS_TXT_BYTES = 64 * 1024


def read_package_requirements(tree: Path, entry_module: str) -> list[str] | None:
    """An uploaded package's ``requirements.txt``, read (never installed) from its root: the
    archive's top (``requirements.txt`` beside the package) or, for a package directory the SDK
    packed under its own name, inside the entry module's top package. One canonical list; None
    when there is none. A bad entry raises :class:`RequirementError` naming it; a file too
    large or not UTF-8, :class:`ValueError`."""
    top = entry_module.split(".", 1)[0]
    for candidate in (tree / "requirements.txt", tree / top / "requirements.txt"):
        if candidate.is_file() and not candidate.is_symlink():
            break
    else:
        return None
    if candidate.stat().st_size > MAX_REQUIREMENTS_TXT_BYTES:
        raise ValueError(f"requirements.txt is larger than {MAX_REQUIREMENTS_TXT_BYTES} bytes")
    try:
        text = candidate.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError("requirements.txt is not UTF-8 text") from None
    entries = read_requirements_txt(text, source=PACKAGE_SOURCE)
    return normalized_requirements((PACKAGE_SOURCE, entries)) or None
