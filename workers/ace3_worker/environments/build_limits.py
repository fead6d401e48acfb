"""What bounds a build's use of the worker's disk, and what makes sure nothing of it outlives it.

``ACE3_ENV_MAX_BYTES`` bounds the environment; its build is bounded as it runs, in both steps
(the resolution downloads wheels too):

- the build's whole work directory (uv's cache, which holds a second, unpacked copy of every
  wheel, the target, uv's home) may hold up to **twice** ``ACE3_ENV_MAX_BYTES`` and
  :data:`MAX_WORK_ENTRIES` entries, the target itself ``ACE3_ENV_MAX_BYTES`` and
  :data:`MAX_FILES`: the worker measures them every :data:`POLL_SECONDS` (less often when
  the walk itself takes longer) and kills uv past either;
- no file may grow past ``ACE3_ENV_MAX_BYTES`` at all (``RLIMIT_FSIZE`` on every process of
  the build, set by ``prlimit`` before bubblewrap or uv starts: a wheel of zeros that unpacks
  to gigabytes stops at the limit, uv killed by ``SIGXFSZ``).

So a build uses at most about twice ``ACE3_ENV_MAX_BYTES`` of disk, transiently, plus what one
poll lets through. Once uv has exited, every process of its process group or session must be
gone before the worker touches the tree (:func:`wait_gone`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from ace3_worker.environments.tree import measure
from ace3_worker.environments.uv_commands import EnvironmentBuildError, EnvironmentRefusedError

# The files, directories and links an environment may hold (the largest CUDA stacks hold tens
# of thousands): a wheel of a million empty files costs the worker's inodes, not its bytes.
MAX_FILES = 200_000
MAX_WORK_ENTRIES = 2 * MAX_FILES  # (uv's cache holds a second copy)
WORK_BYTES_FACTOR = 2
POLL_SECONDS = 0.2
GONE_TIMEOUT_SECONDS = 10.0


def rlimit_prefix(max_bytes: int) -> list[str]:
    """``prlimit`` setting ``RLIMIT_FSIZE`` to ``max_bytes`` (soft and hard: the build uid
    cannot raise it) and no core files (``SIGXFSZ`` would write one)."""
    return ["prlimit", f"--fsize={max_bytes}:{max_bytes}", "--core=0:0", "--"]


class DiskWatch:
    """Measures a build's work directory and its target; raises past the limits."""

    def __init__(self, work: Path, target: Path, max_bytes: int) -> None:
        self.work, self.target, self.max_bytes = work, target, max_bytes
        self.next_at = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    def check(self) -> None:
        """Walk both trees (at most a little past the entry limits) and raise
        :class:`EnvironmentRefusedError` naming the limit when one is passed; the next check
        is due after :data:`POLL_SECONDS` or twice the walk's time, whichever is longer."""
        started = time.monotonic()
        work = measure(self.work, stop_past_entries=MAX_WORK_ENTRIES)
        target = measure(self.target, stop_past_entries=MAX_FILES)
        self.next_at = time.monotonic() + max(POLL_SECONDS, 2 * (time.monotonic() - started))
        check_tree(target.bytes, target.entries, self.max_bytes)
        if work.bytes > WORK_BYTES_FACTOR * self.max_bytes:
            raise EnvironmentRefusedError(
                f"the environment is larger than ACE3_ENV_MAX_BYTES ({self.max_bytes} bytes): "
                f"its build used {work.bytes} bytes or more (uv's cache, a second copy of each "
                f"wheel, counted: a build may use up to {WORK_BYTES_FACTOR}x the limit)"
            )
        if work.entries > MAX_WORK_ENTRIES:
            raise EnvironmentRefusedError(
                f"the environment has more than {MAX_FILES} files (the worker's MAX_FILES): "
                f"its build wrote more than {MAX_WORK_ENTRIES} with uv's cache"
            )


def check_tree(size: int, entries: int, max_bytes: int) -> None:
    """Refuse an environment past ``ACE3_ENV_MAX_BYTES`` or :data:`MAX_FILES`."""
    if size > max_bytes:
        raise EnvironmentRefusedError(
            f"the environment is larger than ACE3_ENV_MAX_BYTES ({max_bytes} bytes): {size} "
            "bytes or more"
        )
    if entries > MAX_FILES:
        raise EnvironmentRefusedError(
            f"the environment has more than {MAX_FILES} files (the worker's MAX_FILES)"
        )


def _group_and_session(pid: str) -> tuple[int, int, str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # (state ppid pgrp session ...)
    return int(fields[2]), int(fields[3]), fields[0]


def survivors(leader: int) -> list[int]:
    """The live processes (zombies aside) of the process group or session ``leader`` started
    (``start_new_session``: both are the step's pid)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _group_and_session(name)
            if info is not None and leader in info[:2] and info[2] not in ("Z", "X"):
                found.append(int(name))
    return found


def wait_gone(leader: int) -> None:
    """Kill whatever of the step's process group and session still runs and wait until it is
    gone, so that nothing of the build uid writes while the worker takes the tree over (in
    ``ACE3_SANDBOX=uid`` there is no PID namespace whose end kills them all)."""
    deadline = time.monotonic() + GONE_TIMEOUT_SECONDS
    while left := survivors(leader):
        if time.monotonic() > deadline:
            raise EnvironmentBuildError(
                f"processes of the build outlived it: {left[:10]} (the worker does not take "
                "its tree over while they run)"
            )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
