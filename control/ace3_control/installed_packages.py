"""The distributions installed in this Python: what a worker advertises (``workers.packages``)
and what every job environment is resolved against, so that an environment only ever adds
packages (docs/environments.md)."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json

from packaging.utils import canonicalize_name


@functools.cache
def installed_packages() -> dict[str, str]:
    """``{canonical name: version}`` of every distribution this interpreter's ``sys.path``
    holds (the first of each name, as ``import`` would find it). Read once per process: a
    worker restarts when its installation changes."""
    found: dict[str, str] = {}
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), distribution.version)
    return dict(sorted(found.items()))


def packages_sha256(packages: dict[str, str]) -> str:
    """The identity of an installed set (part of an environment's hash)."""
    return hashlib.sha256(json.dumps(packages, sort_keys=True).encode()).hexdigest()
