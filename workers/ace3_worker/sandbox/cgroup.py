"""A memory cgroup (v2) for each job sandbox, where the worker has a delegated cgroup v2
directory (``ACE3_JOB_CGROUP_ROOT``): the kernel then holds the job's processes together to
``ACE3_JOB_MEMORY_BYTES``, every page counted once (anonymous, shared memory and ``/dev/shm``,
page cache, kernel memory), with no swap.

:func:`check_cgroup_root` is run when the worker starts and refuses what would not work: a
directory that is not on a cgroup2 mount (a machine with cgroup v1 only, or the hybrid layout's
controller-less ``unified`` tree), without the ``memory`` controller, or not writable. A
sandbox's cgroup (:class:`JobCgroup`) is made when the sandbox is started, named after the
worker process (``ace3-<pid>-<random>``); the sandbox's first process joins it before it runs
anything (:meth:`JobCgroup.wrap`: a shell writes its own PID into ``cgroup.procs``, then
becomes the command), so everything of the job is born in it and its bubblewrap cgroup
namespace makes it the job's root. ``memory.oom.group`` makes the kernel's OOM kill take the
whole sandbox; ``memory.events``' ``oom_kill`` tells the worker it happened. The cgroup is
removed once the sandbox is dead (:meth:`JobCgroup.remove`); one a dead worker left is removed
when the next worker starts (:func:`sweep_cgroups`).

This has been checked against a fake directory tree only (tests/unit/worker/test_job_cgroup.py):
the machines the project's tests run on have cgroup v1.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

MOUNTINFO = Path("/proc/self/mountinfo")
PREFIX = "ace3-"
_NAME = re.compile(r"^ace3-(\d+)-[0-9a-f]+$")
# How long removing a cgroup waits for its last processes to be gone (they were killed).
REMOVE_WAIT_SECONDS = 5.0


class CgroupUnavailableError(RuntimeError):
    """ACE3_JOB_CGROUP_ROOT cannot hold job cgroups; the message says why."""


def _unescape(field: str) -> str:
    """A mountinfo path field (spaces and the like are written ``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_type(path: Path, mountinfo: str) -> str | None:
    """The type of the filesystem ``path`` lies on, from ``/proc/self/mountinfo``'s text (the
    mount with the longest mount point above it); None when no mount covers it."""
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        left, separator, right = line.partition(" - ")
        fields = left.split()
        if not separator or len(fields) < 5 or not right.split():
            continue
        point = Path(_unescape(fields[4]))
        if (path == point or point in path.parents) and (
            best is None or len(point.parts) >= best[0]
        ):
            best = (len(point.parts), right.split()[0])
    return best[1] if best else None


def check_cgroup_root(root: Path, mountinfo: Path = MOUNTINFO) -> None:
    """Raise :class:`CgroupUnavailableError` unless job cgroups can be made under ``root``;
    enable the ``memory`` controller for its children when it is not yet."""
    name = f"ACE3_JOB_CGROUP_ROOT={root}"
    try:
        kind = filesystem_type(root.resolve(), mountinfo.read_text())
    except OSError as exc:
        raise CgroupUnavailableError(f"{name}: cannot read {mountinfo}: {exc}") from exc
    if kind != "cgroup2" or not root.is_dir():
        raise CgroupUnavailableError(
            f"{name} is not a directory of a cgroup v2 hierarchy (it is on {kind or 'nothing'}): "
            "give a delegated cgroup v2 directory, or leave it unset for the worker's own memory "
            "measurement"
        )
    controllers = _read(root / "cgroup.controllers").split()
    if "memory" not in controllers:
        raise CgroupUnavailableError(
            f"{name} has no memory controller (its cgroup.controllers: "
            f"{' '.join(controllers) or 'none'}): enable it in the parent's cgroup.subtree_control"
        )
    if not os.access(root, os.W_OK):
        raise CgroupUnavailableError(f"{name} is not writable by the worker (delegate it)")
    if "memory" not in _read(root / "cgroup.subtree_control").split():
        try:
            _write(root / "cgroup.subtree_control", "+memory")
        except OSError as exc:
            raise CgroupUnavailableError(
                f"{name}: cannot enable the memory controller for its children ({exc}); a cgroup "
                "that holds processes cannot: run the worker outside it, or in a child of it"
            ) from exc


def _write(path: Path, value: str) -> None:
    """Write an interface file of a cgroup (which exists: never created)."""
    handle = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    try:
        os.write(handle, f"{value}\n".encode())
    finally:
        os.close(handle)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise CgroupUnavailableError(f"cannot read {path}: {exc}") from exc


@dataclass
class JobCgroup:
    """The cgroup of one job sandbox."""

    path: Path
    memory_bytes: int
    # What memory.events and the peak said when it was removed (the worker reads them after
    # the sandbox is closed).
    _last_events: dict[str, int] = field(default_factory=dict, repr=False)
    _last_peak: int = field(default=0, repr=False)

    @classmethod
    def create(cls, root: Path, memory_bytes: int) -> JobCgroup:
        """A new child of ``root`` holding its processes to ``memory_bytes``, without swap."""
        path = root / f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        path.mkdir()  # (the kernel makes its interface files)
        try:
            _write(path / "memory.max", str(memory_bytes))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (path / name).exists():  # (absent: a kernel without swap accounting)
                    _write(path / name, value)
        except BaseException:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise
        return cls(path, memory_bytes)

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv``, run by a process that joins this cgroup first (its PID is the command's:
        the shell ``exec``\\s it)."""
        script = 'echo $$ > "$0" && exec "$@"'
        return ["/bin/sh", "-c", script, str(self.path / "cgroup.procs"), *argv]

    def events(self) -> dict[str, int]:
        """``memory.events`` (``oom``, ``oom_kill``...); once removed, what it said last;
        empty when it cannot be read."""
        try:
            text = (self.path / "memory.events").read_text()
        except OSError:
            return dict(self._last_events)
        found = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if value.strip().isdigit():
                found[name] = int(value)
        return found

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer took from this cgroup."""
        return self.events().get("oom_kill", 0)

    def peak_bytes(self) -> int:
        """The most memory its processes held (``memory.peak``, Linux 5.19; else what they
        hold now)."""
        for name in ("memory.peak", "memory.current"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int((self.path / name).read_text().split()[0])
        return self._last_peak

    def populated(self) -> bool:
        try:
            text = (self.path / "cgroup.events").read_text()
        except OSError:
            return False
        return "populated 1" in text

    def remove(self, wait: float = REMOVE_WAIT_SECONDS) -> bool:
        """Remove it once its processes are gone (they were killed; the last ones may still be
        exiting), at most ``wait`` seconds later; whether it is gone."""
        deadline = time.monotonic() + wait
        while True:
            events, peak = self.events(), self.peak_bytes()
            try:
                self.path.rmdir()
                self._last_events, self._last_peak = events, peak
                return True
            except FileNotFoundError:
                return True
            except OSError as exc:
                if time.monotonic() > deadline:
                    logger.warning("could not remove the job cgroup %s: %s", self.path, exc)
                    return False
            time.sleep(0.02 if self.populated() else 0.05)


def sweep_cgroups(root: Path) -> list[Path]:
    """Remove the job cgroups of worker processes that are gone (empty ones: a cgroup that
    still holds a process cannot be removed, and is left); the cgroups removed."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            match = _NAME.match(entry.name)
            if match is None or _alive(int(match.group(1))):
                continue
            with contextlib.suppress(OSError):
                entry.rmdir()
                removed.append(entry)
    if removed:
        logger.warning("removed %d job cgroup(s) a dead worker left under %s", len(removed), root)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
