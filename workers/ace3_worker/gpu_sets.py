"""Which GPUs each running job of this worker holds: a disjoint set per job, by lock files.

A worker hands every attempt it runs (every node of a multi-node job) ``num_gpus`` devices of
its device list (``ACE3_WORKER_GPUS``, default every GPU it sees: :func:`ace3_worker.device.
device_pool`), and the job's ranks get exactly those as ``CUDA_VISIBLE_DEVICES`` (rank i uses
``cuda:i`` of them; the sandbox binds only their device nodes). A device is held by an
exclusive ``flock`` on ``<lock dir>/gpu-<device>.lock`` from before the claim until everything
of the attempt is dead, so the slots of one worker, which are separate processes, and every
other worker of the machine that uses the same lock directory never hand one device to two
jobs. A worker process that dies (killed, out of memory) releases its devices with its file
descriptors; an attempt that ends any other way (finished, failed, cancelled, its lease lost)
releases them in the supervisor's ``finally``.

Devices are taken all at once or not at all, under a short-lived allocation lock, so two slots
never each hold half of what both need. When fewer are free than a job needs, the supervisor
hands the job back to the queue (:class:`DevicesBusyError`) rather than wait with it: another
worker may have them free now.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ALLOCATION_LOCK = "allocate.lock"


class DevicesBusyError(RuntimeError):
    """Fewer of the worker's devices are free than the job needs (others run on them)."""


@dataclass
class DeviceSet:
    """The devices one attempt holds, and the locks that hold them."""

    devices: tuple[str, ...]
    _fds: list[int] = field(default_factory=list, repr=False)

    @property
    def visible_devices(self) -> str:
        """The job's ``CUDA_VISIBLE_DEVICES``."""
        return ",".join(self.devices)

    def release(self) -> None:
        """Let other attempts have the devices (idempotent)."""
        while self._fds:
            os.close(self._fds.pop())

    def keep(self, count: int, prefer: Sequence[str] = ()) -> None:
        """Hold only ``count`` devices, ``prefer`` when it is that many and all of them are held
        (a warm sandbox's devices: :mod:`ace3_worker.warm`), else the first ``count``; the others
        go back at once."""
        if count > len(self.devices):
            raise DevicesBusyError(
                f"the job needs {count} GPUs and {len(self.devices)} were free when it was claimed"
            )
        held = dict(zip(self.devices, self._fds, strict=True))
        kept = (
            list(prefer)
            if len(prefer) == count and all(device in held for device in prefer)
            else list(self.devices[:count])
        )
        for device, fd in held.items():
            if device not in kept:
                os.close(fd)
        self._fds = [held[device] for device in kept]
        self.devices = tuple(kept)


class DeviceAllocator:
    """Hands out disjoint sets of ``pool`` (the worker's devices), machine-wide through the lock
    files in ``lock_dir``."""

    def __init__(self, pool: Sequence[str], lock_dir: Path) -> None:
        self.pool = tuple(pool)
        self.lock_dir = lock_dir

    def acquire(self, count: int) -> DeviceSet:
        """``count`` free devices of the pool, in the pool's order; DevicesBusyError when fewer
        are free (then none is taken)."""
        if count > len(self.pool):
            raise DevicesBusyError(
                f"the job needs {count} GPUs and this worker has {len(self.pool)} "
                f"({','.join(self.pool) or 'none'})"
            )
        held = DeviceSet(())
        taken: list[str] = []
        with self._allocating():
            for device in self.pool:
                if len(taken) == count:
                    break
                fd = self._try_lock(device)
                if fd is not None:
                    held._fds.append(fd)
                    taken.append(device)
            if len(taken) < count:
                free = len(taken)  # (every device of the pool was tried)
                held.release()
                raise DevicesBusyError(
                    f"the job needs {count} GPU{'' if count == 1 else 's'} and {free} of this "
                    f"worker's {len(self.pool)} are free now (the others run jobs)"
                )
        held.devices = tuple(taken)
        return held

    @contextlib.contextmanager
    def reserving_free(self) -> Iterator[DeviceSet]:
        """Every device of the pool that is free now (possibly none), in the pool's order, held
        under the allocation lock while the caller decides what to keep (:meth:`DeviceSet.keep`
        or :meth:`DeviceSet.release`): other allocations on this machine wait meanwhile."""
        held = DeviceSet(())
        taken: list[str] = []
        with self._allocating():
            try:
                for device in self.pool:
                    fd = self._try_lock(device)
                    if fd is not None:
                        held._fds.append(fd)
                        taken.append(device)
                held.devices = tuple(taken)
                yield held
            except BaseException:
                held.release()
                raise

    def _try_lock(self, device: str) -> int | None:
        fd = os.open(
            self.lock_dir / f"gpu-{device}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    @contextlib.contextmanager
    def _allocating(self) -> Iterator[None]:
        self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.lock_dir / ALLOCATION_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
