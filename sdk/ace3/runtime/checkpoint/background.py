"""Asynchronous checkpoint saving (``async_save=True``): stage, then write in the background.

Staging copies every tensor of the checkpoint to CPU memory (:func:`stage_to_cpu`): after it
the training may change its weights and optimizer state, the staged copy stays as it was at the
save's step. The staging memory (one CPU copy of the checkpoint's tensors, pinned for GPU
tensors) is kept and reused by the next save: it costs that much host memory for the run. A background thread then writes the staged state (the plain and gathered formats:
:func:`ace3.runtime.checkpoint.files.save_atomic`; the sharded format: the thread waits for
``torch.distributed.checkpoint.async_save``'s future, then rank 0 packs the shards, see
:mod:`ace3.runtime.checkpoint.sharded`).

:class:`BackgroundWriter` holds at most one save in flight: :meth:`BackgroundWriter.wait`
(called before the next save is staged, before the final checkpoint's record and when the run
ends, also on failure) blocks until it is done and re-raises an error of the background write
on the training thread, so a failed write fails the run at the next step or save. The writer
never touches the event log: the checkpoint record is written on the training thread once the
file is complete (:mod:`ace3.runtime.checkpoint.saver`), so the worker never reads a record
before its file is whole.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ace3.runtime.checkpoint.files import SavedCheckpoint, save_atomic


class BackgroundSaveError(RuntimeError):
    """A checkpoint written in the background failed: the run stops with it."""


def stage_to_cpu(value: Any, buffers: dict[str, torch.Tensor] | None = None) -> Any:
    """A copy of ``value`` whose tensors are CPU tensors that share nothing with the training
    state (containers are rebuilt; other values are kept as they are: they are immutable or
    already copies). A tensor seen twice is staged once (tied weights stay tied).

    ``buffers`` (kept by the caller between saves, keyed by each tensor's place in ``value``):
    a buffer of the same shape and dtype is copied into instead of allocating a new one
    (allocating and first touching hundreds of MB costs more than the copy). The caller must
    not stage again while a write of the previous staged copy is in flight."""
    memo: dict[int, torch.Tensor] = {}
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    cache = buffers if buffers is not None else {}

    def copy(item: Any, where: str) -> Any:
        if isinstance(item, torch.Tensor):
            found = memo.get(id(item))
            if found is None:
                source = item.detach()
                found = cache.get(where)
                if found is None or found.shape != source.shape or found.dtype != source.dtype:
                    # pinned host memory for device tensors: the copies run asynchronously
                    pin = source.device.type == "cuda"
                    found = torch.empty_like(source, device="cpu", pin_memory=pin)
                    if buffers is not None:
                        buffers[where] = found
                copies.append((found, source))
                memo[id(item)] = found
            return found
        if isinstance(item, dict):
            return type(item)((key, copy(entry, f"{where}/{key}")) for key, entry in item.items())
        if isinstance(item, list | tuple):
            items = [copy(entry, f"{where}/{i}") for i, entry in enumerate(item)]
            return items if isinstance(item, list) else tuple(items)
        return item

    staged = copy(value, "")
    for target, source in copies:
        target.copy_(source, non_blocking=source.device.type == "cuda")
    if copies and torch.cuda.is_available():
        torch.cuda.synchronize()
    return staged


@dataclass
class _InFlight:
    name: str
    thread: threading.Thread
    result: SavedCheckpoint | None = None
    error: BaseException | None = None


class BackgroundWriter:
    """At most one checkpoint written by a background thread at a time (see the module
    docstring)."""

    def __init__(self) -> None:
        self._current: _InFlight | None = None
        self._process_group: Any = None
        self._buffers: dict[str, torch.Tensor] = {}  # staging memory, reused save after save

    @property
    def busy(self) -> bool:
        return self._current is not None

    def done(self) -> bool:
        """True when the save in flight (if any) has finished (successfully or not)."""
        return self._current is None or not self._current.thread.is_alive()

    def submit(self, name: str, write: Callable[[], SavedCheckpoint | None]) -> None:
        """Run ``write`` (it must only read staged copies) in the background. The previous save
        must have been waited for."""
        if self._current is not None:
            raise RuntimeError("a checkpoint is still being written: wait() for it first")
        entry = _InFlight(name=name, thread=threading.Thread(target=lambda: None))

        def run() -> None:
            try:
                entry.result = write()
            except BaseException as exc:  # re-raised on the training thread by wait()
                entry.error = exc

        entry.thread = threading.Thread(target=run, name=f"ace3-checkpoint-{name}", daemon=True)
        self._current = entry
        entry.thread.start()

    def submit_state(self, state: dict[str, Any], path: Path) -> None:
        """Stage ``state`` now (a copy in CPU memory), write it atomically at ``path`` in the
        background."""
        if self._current is not None:
            raise RuntimeError("a checkpoint is still being written: wait() for it first")
        staged = stage_to_cpu(state, self._buffers)
        self.submit(path.name, lambda: save_atomic(staged, path))

    def wait(self) -> SavedCheckpoint | None:
        """Block until the save in flight is written; return its file (rank 0; None elsewhere
        or when none was in flight). An error of the background write is raised here."""
        entry, self._current = self._current, None
        if entry is None:
            return None
        entry.thread.join()
        if entry.error is not None:
            raise BackgroundSaveError(
                f"writing checkpoint {entry.name} in the background failed: "
                f"{type(entry.error).__name__}: {entry.error}"
            ) from entry.error
        return entry.result

    def process_group(self) -> Any:
        """A gloo process group of every rank for the collectives of background DCP saves (the
        training's own group must not see collectives from another thread). Created at the
        first sharded save, which every rank reaches at the same point."""
        if self._process_group is None:
            import torch.distributed as dist

            self._process_group = dist.new_group(backend="gloo")
        return self._process_group
