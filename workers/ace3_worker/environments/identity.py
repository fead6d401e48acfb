"""An environment's identity: what its wheels were resolved from and for.

Two jobs share an environment exactly when they ask for the same packages (normalised: the same
set spelled any way gives one hash) on the same Python (major.minor, implementation) and
platform, over the same installed set of the worker (:mod:`ace3_control.installed_packages`).
Any change of the worker's own packages (a new torch) is a new identity, so an environment is
never used over an installation it was not resolved against.
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass

from ace3.config.requirements import normalized_requirements
from ace3_control.installed_packages import installed_packages, packages_sha256


@dataclass(frozen=True)
class EnvironmentIdentity:
    """What an environment is resolved from; ``hash`` names it everywhere (the environments
    row, the store's archive, the worker's cache directory)."""

    requirements: tuple[str, ...]  # normalised (ace3.config.requirements)
    python: str  # "cpython-3.11"
    platform: str  # sysconfig's platform: "linux-x86_64"
    constraints_sha256: str  # of the worker's installed set
    hash: str

    @property
    def short(self) -> str:
        """The first 12 hex digits, for the job's log."""
        return self.hash[:12]


def python_tag() -> str:
    """This interpreter's implementation and major.minor: ``cpython-3.11``."""
    return f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}"


def environment_identity(
    requirements: Iterable[str],
    *,
    installed: dict[str, str] | None = None,
    python: str | None = None,
    platform: str | None = None,
) -> EnvironmentIdentity:
    """The identity of ``requirements`` on this worker (the arguments stand in for this
    worker's own figures in tests). The requirements are normalised again here: the row's list
    comes from the API, and the hash must not depend on how it was spelled."""
    normalised = tuple(normalized_requirements(("requirements", list(requirements))))
    constraints = packages_sha256(installed if installed is not None else installed_packages())
    python = python or python_tag()
    platform = platform or sysconfig.get_platform()
    payload = json.dumps(
        {
            "requirements": normalised,
            "python": python,
            "platform": platform,
            "constraints": constraints,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(payload.encode()).hexdigest()
    return EnvironmentIdentity(normalised, python, platform, constraints, digest)
