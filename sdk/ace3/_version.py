"""The one version source: the installed distribution's metadata (pyproject.toml's
``version``); ``0+unknown`` when the package runs from a source tree that was never installed
(``PYTHONPATH=sdk``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ace3")
except PackageNotFoundError:  # pragma: no cover - an uninstalled source tree
    __version__ = "0+unknown"
