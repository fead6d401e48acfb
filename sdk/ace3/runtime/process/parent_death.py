"""Tie a process's life to its parent's, so no training process outlives its supervisor.

The chain on a worker: the supervisor starts torchrun through this module, which asks the kernel
to SIGKILL it when the supervisor dies (Linux ``PR_SET_PDEATHSIG``; survives ``exec``) and then
becomes torchrun. Every rank calls :func:`exit_with_parent` the same way for the torchrun agent.
Where prctl is unavailable (macOS), a daemon thread notices the parent is gone instead.

    python -m ace3.runtime.process.parent_death EXPECTED_PARENT_PID COMMAND [ARG ...]

Standard library only: importing this never imports torch.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1


def _set_kernel_parent_death_signal() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int, poll_seconds: float) -> None:
    while True:
        time.sleep(poll_seconds)
        if os.getppid() != parent:
            os.write(2, b"ace3: the parent process is gone; stopping\n")
            os._exit(137)


def exit_with_parent(expected_parent: int | None = None, poll_seconds: float = 1.0) -> None:
    """Die when the parent dies. If it is already gone (we were re-parented), exit now."""
    parent = os.getppid() if expected_parent is None else expected_parent
    if not _set_kernel_parent_death_signal():
        threading.Thread(
            target=_watch_parent, args=(parent, poll_seconds), daemon=True, name="ace3-parent-watch"
        ).start()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(137)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.exit(
            "usage: python -m ace3.runtime.process.parent_death EXPECTED_PARENT_PID COMMAND [ARG ...]"
        )
    if not _set_kernel_parent_death_signal():
        sys.exit("ace3: PR_SET_PDEATHSIG is not available on this platform")
    if os.getppid() != int(argv[0]):
        os._exit(137)
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
