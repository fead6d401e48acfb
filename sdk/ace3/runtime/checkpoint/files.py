"""Checkpoint files: atomic save, sha256, safe load, pruning.

A checkpoint is written atomically (:func:`ace3.files.write_atomic`: a temporary file in the
same directory, fsync'ed, renamed over its final name): a reader never sees a partial file.
Contents are plain tensors and containers only, so ``torch.load(weights_only=True)`` reads
them.

Sharded jobs (ZeRO) write ``step-XXXXXXXX.dcp.tar`` instead: one uncompressed tar of a
``torch.distributed.checkpoint`` directory plus the train state (see
:mod:`ace3.runtime.checkpoint.sharded`, :mod:`ace3.runtime.checkpoint.archive`); :func:`load_checkpoint`
recognises it by its content.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ace3.config.checkpoint_names import CHECKPOINT_NAME_RE
from ace3.files import WrittenFile, sha256_file, write_atomic
from ace3.runtime.checkpoint.archive import is_sharded_archive, read_train_state

SavedCheckpoint = WrittenFile  # a checkpoint file written atomically


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def save_atomic(state: dict[str, Any], path: Path) -> SavedCheckpoint:
    """Write ``state`` to ``path`` atomically; return its sha256 and size."""
    return write_atomic(path, lambda handle: torch.save(state, handle))


def load_checkpoint(path: Path, expected_sha256: str | None = None) -> dict[str, Any]:
    """Load with ``weights_only=True`` onto the CPU, verifying the sha256 when one is given.

    A sharded checkpoint (``.dcp.tar``) gives its train state only, with ``archive`` (its path)
    and ``format`` 2: the weights are loaded by every rank when the job is assembled
    (:func:`ace3.runtime.checkpoint.sharded.load_sharded_model_and_optimizer`)."""
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if expected_sha256 is not None:
        actual = sha256_file(path)
        if actual.lower() != expected_sha256.lower():
            raise ValueError(
                f"checkpoint {path} is corrupt or not the expected file: sha256 {actual}, "
                f"expected {expected_sha256.lower()}"
            )
    if is_sharded_archive(path):
        return read_train_state(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise ValueError(f"{path} is not an ACE3 checkpoint (no 'model' and 'step' entries)")
    return state


def prune_checkpoint_files(
    directory: Path, keep: int, protect: frozenset[str] = frozenset()
) -> list[Path]:
    """Delete all but the newest ``keep`` ``step-*.pt`` / ``step-*.dcp.tar`` files (never the
    newest one), and never those named in ``protect`` (the best checkpoint: kept beside the
    newest ``keep``)."""
    found = sorted(
        (int(match.group(1)), path)
        for path in directory.iterdir()
        if (match := CHECKPOINT_NAME_RE.match(path.name))
    )
    older = found[: max(0, len(found) - max(keep, 1))]
    doomed = [path for _, path in older if path.name not in protect]
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed
