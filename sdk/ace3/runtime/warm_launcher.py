"""A warm launcher: torchrun's agent, started in a job's sandbox before any job is assigned to it.

The worker starts it as a slot's next sandbox (:mod:`ace3_worker.warm`)::

    python -m ace3.runtime.warm_launcher --control-fd N

It imports torch, torchrun's agent and the engine (:data:`PRELOADED`, including what the first
optimizer step would otherwise import), and no user code; no tensor is made, nothing compiled,
no thread started, CUDA never initialised. It says on its control socket that it runs
(:class:`ace3.config.warm_launch.LauncherStarted`: the sandbox around it is set up) and then
that it is ready (:class:`~ace3.config.warm_launch.LauncherReady`), then waits for its one job
(:class:`~ace3.config.warm_launch.WarmJob`), closes the socket, takes the job's environment as
its whole environment and runs torchrun (:func:`ace3.runtime.torchrun.main`) with the job's
arguments. Those differ from the cold path's in one place: the ranks run :data:`RANK_ENTRY`
through torchrun's ``--run-path`` with ``--start-method=fork`` instead of ``-m ace3.runtime``,
so each rank is a fork of this process, with everything already imported. It is still
torchrun's agent that starts, watches and stops the ranks, on this process's main thread (its
SIGTERM handler is installed only there).

A rank starts from the agent's state, not from a new interpreter's, so :func:`run_rank` first
puts back what a new interpreter would have: the default signal dispositions (the agent
installed its own before it forked), a name of its own (``ace3-rank-<rank>``; the agent's was
inherited), the thread count the job's ``OMP_NUM_THREADS`` asks for (the OpenMP runtime read
the variable when torch was imported, before the job's environment was known), the command
line; and it returns (or raises ``SystemExit`` with the exit status) instead of ending with
``os._exit``: torchrun counts a function's rank as done only when the function returns.

What a warm rank's ``/proc/<pid>/environ`` shows is the environment the launcher was started
with (the kernel keeps a process's first environment there); ``os.environ`` and what the job
starts are the job's own.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import os
import signal
import socket
import sys
import tempfile
import time

from ace3.config.warm_launch import (
    LauncherReady,
    LauncherStarted,
    parse_job,
    read_line,
    send_message,
)

# How the worker starts it: ``COMMAND + ["--control-fd", str(fd)]``.
COMMAND = [sys.executable, "-m", "ace3.runtime.warm_launcher"]
# The file torchrun runs (``--run-path``) in each rank it forks from the launcher.
RANK_ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_rank.py")
WARM_RANK_ARGS = ["--run-path", "--start-method=fork", RANK_ENTRY]

_PR_SET_NAME = 15

# Set by the sandbox itself (bubblewrap's --chdir), as for a cold path's torchrun: kept.
SANDBOX_VARIABLES = ("PWD",)

# What a rank would otherwise import after it starts: torch and torchrun's agent, the engine
# (what ace3.runtime.__main__ imports to train), and torch._dynamo, which the first optimizer
# step imports (torch.optim's methods are wrapped by torch._disable_dynamo): 1.5 s on 2 cores.
PRELOADED = (
    "torch",
    "torch.distributed.run",
    "torch.distributed.launcher.api",
    "torch.distributed.elastic.multiprocessing",
    "ace3.runtime.__main__",
    "ace3.runtime.build",
    "ace3.runtime.distributed",
    "ace3.runtime.hook_factory",
    "ace3.runtime.job_spec",
    "ace3.runtime.loop",
    "ace3.runtime.memory_meter",
    "ace3.runtime.speed",
    "torch._dynamo",
)


def preload() -> float:
    """Import :data:`PRELOADED`; the seconds it took. Refuses to have initialised CUDA (a fork
    of a process that did cannot use it)."""
    started = time.monotonic()
    for name in PRELOADED:
        importlib.import_module(name)
    torch = sys.modules["torch"]
    if torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised while importing: the ranks could not use it")
    return time.monotonic() - started


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ace3.runtime.warm_launcher")
    parser.add_argument("--control-fd", type=int, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    control = socket.socket(fileno=args.control_fd)
    send_message(control, LauncherStarted())
    seconds = preload()
    sys.stdout.flush()  # (nothing buffered may be copied into the ranks)
    sys.stderr.flush()
    with contextlib.suppress(OSError):  # (the worker may have sent the job and gone)
        send_message(control, LauncherReady(seconds=round(seconds, 3)))
    line = read_line(control)
    control.close()  # (the job never holds a way to the worker)
    if not line:  # the worker let this launcher go without a job
        os._exit(0)
    job = parse_job(line)
    kept = {name: os.environ[name] for name in SANDBOX_VARIABLES if name in os.environ}
    os.environ.clear()
    os.environ.update({**job.env, **kept})
    tempfile.tempdir = None  # (found again from the job's TMPDIR)
    from ace3.runtime.torchrun import main as torchrun

    sys.argv = [sys.argv[0], *job.argv]
    torchrun(list(job.argv))


# -- in each rank ---------------------------------------------------------------------------------
def _new_interpreter_signals() -> None:
    """The dispositions a new interpreter starts with (the agent's handlers were inherited)."""
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _name_process(name: str) -> None:
    """This process's name in ``ps`` and ``top`` (Linux ``PR_SET_NAME``; the agent's,
    ``pt_elastic``, was inherited)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _job_threads() -> None:
    """The job's ``OMP_NUM_THREADS`` (torch read it at import, when the launcher's was set)."""
    import torch

    wanted = os.environ.get("OMP_NUM_THREADS", "")
    if wanted.isdigit() and int(wanted) > 0:
        torch.set_num_threads(int(wanted))


def run_rank(argv: list[str]) -> None:
    """One rank of the job, in a process forked by the agent: ``python -m ace3.runtime`` as a
    function. Returns on success, else raises ``SystemExit`` with the rank's exit status."""
    _new_interpreter_signals()
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


if __name__ == "__main__":
    main()
