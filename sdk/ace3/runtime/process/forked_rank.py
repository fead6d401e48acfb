"""A rank forked from a warm launcher (:mod:`ace3.runtime.process.warm_launcher`): ``python -m
ace3.runtime`` as a function, in a process that starts from the agent's state, not a new
interpreter's.

:func:`run_rank` first puts back what a new interpreter would have: the default signal
dispositions (the agent installed its own before it forked), :mod:`multiprocessing`'s default
start method (the forkserver it came through set its own), a name of its own
(``ace3-rank-<rank>``; the agent's, ``pt_elastic``, was inherited), the thread counts the job's
``OMP_NUM_THREADS`` asks for (torch's, and the BLAS pools numpy loaded in the launcher: their
runtimes read the variable when they were loaded, before the job's environment was known), the
command line and ``sys.path[0]``. Then it runs the engine, and returns (or raises
``SystemExit`` with the exit status) instead of ending with ``os._exit``: torchrun counts a
function's rank as done only when the function returns.

What a warm rank's ``/proc/<pid>/environ`` shows is the environment the launcher was started
with (the kernel keeps a process's first environment there); ``os.environ`` and what the job
starts are the job's own.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

_PR_SET_NAME = 15


def _new_interpreter_signals() -> None:
    """The dispositions a new interpreter starts with (the agent's handlers were inherited)."""
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _new_interpreter_start_method() -> None:
    """The default start method a new interpreter has: a fork of the zygote came through
    :mod:`multiprocessing`'s forkserver, which made its own method the rank's default (the
    job's ``DataLoader`` workers would then be started by pickling, not forked)."""
    import multiprocessing

    multiprocessing.set_start_method(None, force=True)


def _name_process(name: str) -> None:
    """This process's name in ``ps`` and ``top`` (Linux ``PR_SET_NAME``)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _job_threads() -> None:
    """The job's ``OMP_NUM_THREADS`` for torch's thread pool and the BLAS pools."""
    import torch
    from threadpoolctl import threadpool_limits

    wanted = os.environ.get("OMP_NUM_THREADS", "")
    if wanted.isdigit() and int(wanted) > 0:
        torch.set_num_threads(int(wanted))
        threadpool_limits(limits=int(wanted), user_api="blas")


def run_rank(argv: list[str]) -> None:
    """One rank of the job, in a process forked by the launcher's zygote. Returns on success, else raises
    ``SystemExit`` with the rank's exit status."""
    _new_interpreter_signals()
    _new_interpreter_start_method()
    _name_process(f"ace3-rank-{os.environ.get('RANK', '')}")
    _job_threads()
    from ace3.runtime import __main__ as entry

    sys.argv = [entry.__file__, *argv]
    sys.path[0] = os.getcwd()  # (``-m``'s entry: the directory, which may have been renamed)
    try:
        code = entry.main(argv)
    except KeyboardInterrupt:  # (a new interpreter ends by SIGINT itself)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        raise
    entry.finish()
    if code:
        raise SystemExit(code)
