"""An environment's identity: what its wheels were resolved from and for.

Two jobs share an environment exactly when they ask for the same packages (normalised: the same
set spelled any way gives one hash) on the same Python (major.minor, implementation), platform
and ABI (the interpreter's ``SOABI``, the C library and its version, the most specific wheel tag
the interpreter accepts), over the same installed set of the worker
(:mod:`ace3_control.installed_packages`), from the same wheel sources (``ACE3_PIP_INDEX_URL``,
``EXTRA_INDEX_URL``, ``FIND_LINKS``, ``OFFLINE``, ``ALLOW_SOURCE_BUILDS``). Any change of the
worker's own packages (a new torch), of its machine's ABI (another glibc) or of where its wheels
come from (another index, source builds allowed) is a new identity, so an environment is never
used over an installation, a machine or a policy it was not resolved for. A URL's credentials
(``user:password@``) are left out of the hash: rotating a token is the same index.
"""

from __future__ import annotations

import hashlib
import json
import platform as platform_module
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from packaging.tags import sys_tags

from ace3.config.requirements import normalized_requirements
from ace3_control.environment_settings import EnvironmentSettings
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
    abi: str = ""  # "cpython-311-x86_64-linux-gnu glibc-2.36 cp311-cp311-linux_x86_64"
    sources: str = ""  # where wheels come from (JSON, credentials left out)

    @property
    def short(self) -> str:
        """The first 12 hex digits, for the job's log."""
        return self.hash[:12]


def python_tag() -> str:
    """This interpreter's implementation and major.minor: ``cpython-3.11``."""
    return f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}"


def abi_tag() -> str:
    """What compiled wheels this interpreter and machine can load: the interpreter's SOABI,
    the C library and its version, and the most specific wheel tag it accepts."""
    libc, version = platform_module.libc_ver()
    tag = next(iter(sys_tags()), None)
    return " ".join(
        [
            str(sysconfig.get_config_var("SOABI") or "none"),
            f"{libc or 'nolibc'}-{version or '0'}",
            str(tag) if tag is not None else "none",
        ]
    )


def without_credentials(location: str) -> str:
    """``location`` (a URL or a path) without ``user:password@`` in a URL's authority."""
    if "://" not in location:
        return location
    parts = urlsplit(location)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def wheel_sources(settings: EnvironmentSettings) -> str:
    """Where a build's wheels come from and what it may run, as the hash sees it (JSON)."""

    def each(value: str | None) -> list[str]:
        return [without_credentials(item) for item in (value or "").split()]

    return json.dumps(
        {
            "index_url": each(settings.pip_index_url),
            "extra_index_url": each(settings.pip_extra_index_url),
            "find_links": each(settings.pip_find_links),
            "offline": settings.pip_offline,
            "allow_source_builds": settings.pip_allow_source_builds,
        },
        sort_keys=True,
    )


def environment_identity(
    requirements: Iterable[str],
    *,
    settings: EnvironmentSettings | None = None,
    installed: dict[str, str] | None = None,
    python: str | None = None,
    platform: str | None = None,
    abi: str | None = None,
) -> EnvironmentIdentity:
    """The identity of ``requirements`` on this worker, whose wheel sources are ``settings``'
    (default: the ``ACE3_PIP_*`` variables, as the worker reads them); the other arguments
    stand in for this machine's own figures in tests. The requirements are normalised again
    here: the row's list comes from the API, and the hash must not depend on how it was
    spelled."""
    normalised = tuple(normalized_requirements(("requirements", list(requirements))))
    constraints = packages_sha256(installed if installed is not None else installed_packages())
    python = python or python_tag()
    platform = platform or sysconfig.get_platform()
    abi = abi or abi_tag()
    sources = wheel_sources(settings if settings is not None else EnvironmentSettings())
    payload = json.dumps(
        {
            "requirements": normalised,
            "python": python,
            "platform": platform,
            "abi": abi,
            "constraints": constraints,
            "sources": sources,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(payload.encode()).hexdigest()
    return EnvironmentIdentity(normalised, python, platform, constraints, digest, abi, sources)
