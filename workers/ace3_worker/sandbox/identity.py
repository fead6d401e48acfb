"""A dedicated uid for each running job: leased from a range by a lock file, one job at a time.

A root worker runs each attempt's processes as a uid of its own (``ACE3_SANDBOX_UID_BASE`` and
the ``ACE3_SANDBOX_UID_COUNT - 1`` after it; the gid is the same number). A uid is held by an
exclusive ``flock`` on ``<ACE3_SANDBOX_LOCK_DIR>/uid-<n>.lock`` for the attempt's whole life, so
every worker process of the machine (all of them use the same lock directory) picks a different
one, and a worker that dies releases its uids with its file descriptors. Before a uid is handed
out and after the attempt ends, every process still running as it is killed, so no process of one job
meets the next job that gets the uid (files are another matter outside bubblewrap, whose /tmp
is the attempt's own: docs/security.md); the process-count rlimit counts the
processes of one job only.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import logging
import os
import pwd
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)


class NoFreeIdentityError(RuntimeError):
    """Every uid of the range is in use by a running job of this machine."""


@dataclass
class JobIdentity:
    """The uid and gid one attempt's processes run as, and the lock that holds them."""

    uid: int
    gid: int
    _lock_fd: int | None = field(default=None, repr=False)

    @property
    def user_name(self) -> str:
        return "ace3job"

    def release(self) -> None:
        """Kill what still runs as this uid, then let another attempt have it."""
        kill_processes_of(self.uid)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def check_uid_range(base: int, count: int) -> None:
    """Refuse a range that overlaps an account or a group of this machine (the job would get
    its files: a job's gid is its uid's number)."""
    for number in range(base, base + count):
        for kind, lookup in (("account", pwd.getpwuid), ("group", grp.getgrgid)):
            try:
                name = lookup(number)[0]
            except KeyError:
                continue
            raise ValueError(
                f"{'uid' if kind == 'account' else 'gid'} {number} belongs to the {kind} "
                f"{name!r}: jobs must not run as an existing {kind}; set "
                f"ACE3_SANDBOX_UID_BASE to a range of {count} unused uids and gids"
            )


def lease_identity(lock_dir: Path, base: int, count: int) -> JobIdentity:
    """Take the first free uid of the range (non-blocking locks; raise when all are taken)."""
    lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(lock_dir, 0o700)
    for uid in range(base, base + count):
        fd = os.open(lock_dir / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        kill_processes_of(uid)  # (a job of a worker that died may have left some)
        return JobIdentity(uid, uid, fd)
    raise NoFreeIdentityError(
        f"all {count} sandbox uids from {base} are in use by running jobs on this machine; "
        "raise ACE3_SANDBOX_UID_COUNT"
    )


def processes_of(uid: int) -> list[int]:
    """PIDs of the live (not zombie) processes whose real or effective uid is ``uid``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
            real, effective = (int(value) for value in fields["Uid"].split()[:2])
        except (OSError, ValueError, KeyError):
            continue
        if uid in (real, effective) and not fields.get("State", "").strip().startswith("Z"):
            found.append(int(entry.name))
    return found


def tasks_of(uid: int) -> int:
    """How many threads the processes of ``uid`` run (what ``RLIMIT_NPROC`` counts)."""
    total = 0
    for pid in processes_of(uid):
        try:
            total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return total


def kill_processes_of(uid: int, timeout: float = 5.0) -> int:
    """SIGKILL every process running as ``uid`` until none is left (a process that forks while
    it is being killed is found on the next pass); return how many were killed."""
    killed = 0
    deadline = time.monotonic() + timeout
    while pids := processes_of(uid):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        if time.monotonic() > deadline:
            logger.error("processes of uid %d survive SIGKILL: %s", uid, pids[:20])
            break
        time.sleep(0.02)
    return killed
