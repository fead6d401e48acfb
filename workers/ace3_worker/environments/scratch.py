"""Build scratch directories: where an environment is resolved, installed and packed, on the
worker's work filesystem (``<work_dir>/.env-builds/<random>``), not in ``/tmp`` (often a RAM
``tmpfs``, and uv's download cache may hold gigabytes).

The work directory is 0711 (passable, not listable) and so is ``.env-builds`` (root's when the
worker is root): the build's uid (``ACE3_SANDBOX=uid``) reaches its own scratch by its random
name but lists nobody's. Each scratch is held in use by an exclusive ``flock`` on its own
directory fd (:func:`build_scratch`) from its creation until it is removed; a worker process
starting (:func:`sweep_build_scratch`) removes every scratch nobody holds, those of a worker
that was killed mid-build, and never another live process's (two worker processes share a
machine's work directory).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from ace3_worker.environments.cache import remove_tree
from ace3_worker.held_dirs import lock_if_unheld, make_held_dir

logger = logging.getLogger(__name__)

BUILDS_DIR = ".env-builds"
BUILDS_DIR_MODE = 0o711  # (the build uid passes through to its scratch, lists nothing)
SCRATCH_MODE = 0o755  # (the build uid reads its inputs there; its work/ is its own, 0700)


def builds_dir(work_dir: Path) -> Path:
    """``<work_dir>/.env-builds``, made (0711) when it is not there."""
    work_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
    parent = work_dir / BUILDS_DIR
    parent.mkdir(mode=BUILDS_DIR_MODE, exist_ok=True)
    if parent.stat().st_uid == os.geteuid():
        parent.chmod(BUILDS_DIR_MODE)
    return parent


@contextlib.contextmanager
def build_scratch(work_dir: Path) -> Iterator[Path]:
    """A new empty scratch directory under ``<work_dir>/.env-builds``, held (its lock) while
    the caller uses it and removed afterwards, on every path."""
    scratch, fd = make_held_dir(builds_dir(work_dir), lambda: secrets.token_hex(16), SCRATCH_MODE)
    try:
        scratch.chmod(SCRATCH_MODE)
        yield scratch
    finally:
        try:
            remove_tree(scratch)
        finally:
            os.close(fd)


def sweep_build_scratch(work_dir: Path) -> list[Path]:
    """Remove the build scratch directories no live process holds; those removed."""
    removed: list[Path] = []
    try:
        entries = list((work_dir / BUILDS_DIR).iterdir())
    except OSError:
        return removed
    for path in entries:
        if path.is_symlink() or not path.is_dir():
            remove_tree(path)  # (not a directory: nothing a build made)
            continue
        fd = lock_if_unheld(path)
        if fd is None:
            continue  # (a live build's)
        try:
            if remove_tree(path):
                removed.append(path)
        finally:
            os.close(fd)
    if removed:
        logger.warning(
            "removed %d environment build director%s left by a worker killed mid-build: %s",
            len(removed),
            "y" if len(removed) == 1 else "ies",
            ", ".join(str(path) for path in removed[:10]),
        )
    return removed
