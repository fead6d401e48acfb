"""Checkpoint files: atomic save, sha256, safe load, pruning.

A checkpoint is written to a temporary file in the same directory, flushed and fsync'ed, renamed
over its final name with ``os.replace`` and the directory fsync'ed: a reader never sees a partial
file. Contents are plain tensors and containers only, so ``torch.load(weights_only=True)``
reads them.

Sharded jobs (ZeRO) write ``step-XXXXXXXX.dcp.tar`` instead: one uncompressed tar of a
``torch.distributed.checkpoint`` directory plus the train state (see
:mod:`ace3.runtime.sharded_checkpoint`); :func:`load_checkpoint` recognises it by its content.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch


@dataclass(frozen=True)
class SavedCheckpoint:
    path: Path
    sha256: str
    size_bytes: int


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform/filesystem
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_atomic(state: dict[str, Any], path: Path) -> SavedCheckpoint:
    """Write ``state`` to ``path`` atomically; return its sha256 and size."""
    return write_atomic(path, lambda handle: torch.save(state, handle))


def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> SavedCheckpoint:
    """Create ``path`` atomically with what ``write(handle)`` writes; return its sha256 and
    size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        digest = sha256_file(tmp)
        size = tmp.stat().st_size
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)
    return SavedCheckpoint(path=path.resolve(), sha256=digest, size_bytes=size)


def load_checkpoint(path: Path, expected_sha256: str | None = None) -> dict[str, Any]:
    """Load with ``weights_only=True`` onto the CPU, verifying the sha256 when one is given.

    A sharded checkpoint (``.dcp.tar``) gives its train state only, with ``archive`` (its path)
    and ``format`` 2: the weights are loaded by every rank when the job is assembled
    (:func:`ace3.runtime.sharded_checkpoint.load_sharded_model_and_optimizer`)."""
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if expected_sha256 is not None:
        actual = sha256_file(path)
        if actual.lower() != expected_sha256.lower():
            raise ValueError(
                f"checkpoint {path} is corrupt or not the expected file: sha256 {actual}, "
                f"expected {expected_sha256.lower()}"
            )
    from ace3.runtime.sharded_checkpoint import is_sharded_archive, read_train_state

    if is_sharded_archive(path):
        return read_train_state(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise ValueError(f"{path} is not an ACE3 checkpoint (no 'model' and 'step' entries)")
    return state
