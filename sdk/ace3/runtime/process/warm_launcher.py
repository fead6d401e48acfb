"""A warm launcher: torchrun's agent, started in a job's sandbox before any job is assigned to it.

The worker starts it as a slot's next sandbox (:mod:`ace3_worker.warm`), by its path::

    python .../ace3/runtime/process/warm_launcher.py --control-fd N

It says on its control socket that it runs (:class:`ace3.config.warm_launch.LauncherStarted`:
the sandbox around it is set up), before it imports anything but the standard library, so the
worker learns that within a Python start-up. Then it imports torch, torchrun's agent and the
engine (:data:`PRELOADED`, including what the first optimizer step would otherwise import), and
no user code; no tensor is made, nothing compiled, no thread started, CUDA never initialised.
It says it is ready (:class:`~ace3.config.warm_launch.LauncherReady`), waits for its one job
(:class:`~ace3.config.warm_launch.WarmJob`), closes the socket, takes the job's environment as
its whole environment and runs torchrun (:func:`ace3.runtime.process.torchrun.main`) with the job's
arguments. Those differ from the cold path's in one place: the ranks run :data:`RANK_ENTRY`
through torchrun's ``--run-path`` with ``--start-method=forkserver`` instead of ``-m
ace3.runtime``, and the forkserver is a fork of this process made just before torchrun starts
(:mod:`ace3.runtime.process.rank_zygote`: one thread, the agent's threads not started yet), so
each rank is a fork of it, with everything already imported
(:mod:`ace3.runtime.process.forked_rank` puts back what a new interpreter would have). It is
still torchrun's agent that starts, watches and stops the ranks, on this process's main thread
(its SIGTERM handler is installed only there), and learns each rank's exit status from the
zygote, which reaps it: a process the rank forked cannot make the agent wait for it.

Started by its path, not with ``-m``: that would import the ``ace3`` package (the SDK, about
0.6 s) before it could say it runs. Standard library only until then.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import socket
import sys
import tempfile
import time

# How the worker starts it: ``COMMAND + ["--control-fd", str(fd)]``.
COMMAND = [sys.executable, os.path.abspath(__file__)]
# The file torchrun runs (``--run-path``) in each rank it forks from the launcher.
RANK_ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm_rank.py")
# (forkserver: the forks of the zygote, :mod:`ace3.runtime.process.rank_zygote`)
WARM_RANK_ARGS = ["--run-path", "--start-method=forkserver", RANK_ENTRY]
# ace3.config.warm_launch.LauncherStarted, written before that module (pydantic) is imported.
STARTED_LINE = b'{"type":"started"}\n'

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
    "ace3.runtime.process.distributed",
    "ace3.runtime.observe.hook_factory",
    "ace3.runtime.job_spec",
    "ace3.runtime.loop.loop",
    "ace3.runtime.observe.memory_meter",
    "ace3.runtime.loop.speed",
    "ace3.runtime.process.forked_rank",
    "ace3.runtime.process.torchrun",
    "torch._dynamo",
    # (a rank sizes the BLAS pools with it; imported here, what it sets in os.environ at import
    # is gone with the launcher's environment before the job's is set)
    "threadpoolctl",
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
    parser = argparse.ArgumentParser(prog="ace3/runtime/process/warm_launcher.py")
    parser.add_argument("--control-fd", type=int, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    os.set_inheritable(args.control_fd, False)  # (nothing this process starts may hold it)
    control = socket.socket(fileno=args.control_fd)
    control.sendall(STARTED_LINE)
    seconds = preload()
    from ace3.runtime.process import rank_zygote

    threads_when_preloaded = rank_zygote.threads()
    from ace3.config.warm_launch import LauncherReady, parse_job, read_line, send_message
    from ace3.runtime.process.torchrun import main as torchrun

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
    sys.argv = [sys.argv[0], *job.argv]
    if WARM_RANK_ARGS[1] in job.argv:  # (the last moment this process runs one thread)
        why = rank_zygote.start(PRELOADED, threads_when_preloaded)
        if why is not None:
            print(
                f"ace3: the ranks come from a forkserver that imports again: {why}", file=sys.stderr
            )
    torchrun(list(job.argv))


if __name__ == "__main__":
    # Started by its path, Python put this file's directory first on sys.path; ``-m`` would
    # have put the working directory there (as for the cold path's ranks).
    sys.path[0] = os.getcwd()
    main()
