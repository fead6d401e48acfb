"""The module paths of earlier releases, still importable: ``import ace3.callbacks`` and
``from ace3.optimizers import Adam8bit`` load the module that holds those names now.

This matters beyond user scripts: a job's config stored by an earlier SDK carries its callbacks
as source code with lines like ``from ace3.callbacks import EarlyStopping``, and such a job can
still be queued or retried after an upgrade. An alias is resolved only when it is imported, so
``import ace3`` stays free of torch; the aliased name and the new one are the same module
object."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

OLD_PATHS = {
    "ace3.amp": "ace3.training.amp",
    "ace3.callbacks": "ace3.training.callbacks",
    "ace3.checkpoint_files": "ace3.training.checkpoints",
    "ace3.data": "ace3.training.data",
    "ace3.loggers": "ace3.training.loggers",
    "ace3.optimizers": "ace3.training.optimizers",
    "ace3.profiling": "ace3.training.profiling",
    "ace3.schedulers": "ace3.training.schedulers",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target
        self.own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system stamped the alias's spec on the module: give it its own back
        module.__spec__ = self.own_spec


class OldPathFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`OLD_PATHS` (and only those)."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = OLD_PATHS.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    if not any(isinstance(finder, OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(OldPathFinder())
