"""The process a warm launcher's ranks are forked from: a fork of the launcher made before
torchrun's agent starts, so it has everything the launcher imported and runs one thread.

Ranks used to be forks of the agent itself (``--start-method=fork``). By then the agent runs
threads of its own (its rendezvous store's server loop, the rendezvous keep-alive), and a fork
copies whatever lock another thread held at that instant into a child where nothing will ever
release it: now and then (one full test-suite run in three) a rank stayed in ``TCPStore``'s
client constructor while its peers waited for it in gloo's full mesh, until the process-group
timeout. A single-threaded process is the only safe one to fork from.

:func:`start` forks that process just before the launcher hands itself to torchrun (the job's
environment, working directory and arguments already set, the launcher still one thread) and
makes it the server of :mod:`multiprocessing`'s ``forkserver`` start method in this process:
the job's torchrun runs its ranks with ``--start-method=forkserver``
(:data:`ace3.runtime.process.warm_launcher.WARM_RANK_ARGS`), so its agent asks the zygote for
each rank and learns each one's exit status from it, exactly as from the forkserver
:mod:`multiprocessing` would have executed (which would import torch and the engine again, a
second or more on a small machine). The zygote is ``multiprocessing.forkserver.main`` itself,
entered in a fork instead of a new interpreter.

It dies with the launcher (``PR_SET_PDEATHSIG``), and each rank dies with it
(:func:`ace3.runtime.process.parent_death.exit_with_parent`): a rank never outlives its agent.
It ignores SIGTERM, SIGHUP and SIGQUIT (each rank puts the defaults back,
:mod:`ace3.runtime.process.forked_rank`): a SIGTERM to the whole process group must reach the
ranks as a request to checkpoint, not as their parent's death.
Where the interpreter's ``forkserver`` internals are not the ones this knows, or the launcher
already runs a second thread, :func:`start` says why and leaves :mod:`multiprocessing` to start
its own forkserver (preloading the launcher's modules): slower, never unsafe.

Standard library only (it runs in the launcher once that imported the engine).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import socket
import sys
import traceback
from collections.abc import Sequence
from multiprocessing import connection, forkserver, resource_tracker
from typing import Any

from ace3.runtime.process.parent_death import exit_with_parent

START_METHOD = "forkserver"
# The state multiprocessing keeps about its forkserver (CPython 3.11-3.12's ForkServer).
_SERVER_STATE = frozenset(
    {
        "_forkserver_address",
        "_forkserver_alive_fd",
        "_forkserver_pid",
        "_inherited_fds",
        "_lock",
        "_preload_modules",
    }
)
_SERVER_MAIN = ("listener_fd", "alive_r", "preload")


def start(fallback_preload: Sequence[str], threads_when_preloaded: int) -> str | None:
    """Fork the zygote and make it this process's forkserver; None, or why not (then the
    forkserver :mod:`multiprocessing` starts will import ``fallback_preload`` first).
    ``threads_when_preloaded``: :func:`threads` once the launcher had imported everything (the
    idle pool of numpy's OpenBLAS, which shuts itself down around a fork): a thread started
    since then refuses the fork."""
    # (also what a stock forkserver imports, should the zygote die and multiprocessing start one)
    forkserver.set_forkserver_preload(list(fallback_preload))
    reason = _why_not(threads_when_preloaded) or _ranks_get_the_agents_environment()
    if reason is not None:
        return reason
    resource_tracker.ensure_running()  # (its fd goes to every rank: started here, not per rank)
    server: Any = forkserver._forkserver  # (private: its state is checked by _why_not)
    alive_r, alive_w = os.pipe()
    with socket.socket(socket.AF_UNIX) as listener:
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]  # (private, not in the stubs)
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the zygote: never returns
            _serve(listener.fileno(), alive_r, alive_w, parent)
    os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    return None


def _why_not(threads_when_preloaded: int) -> str | None:
    if not sys.platform.startswith("linux"):
        return f"a zygote needs Linux (this is {sys.platform})"
    server = getattr(forkserver, "_forkserver", None)
    if server is None or set(vars(server)) != _SERVER_STATE:
        return "this Python's multiprocessing.forkserver keeps state this launcher does not know"
    if tuple(inspect.signature(forkserver.main).parameters)[:3] != _SERVER_MAIN:
        return "this Python's multiprocessing.forkserver.main takes arguments this does not know"
    if server._forkserver_pid is not None:
        return "a forkserver already runs"
    now = threads()
    if now < 1 or now != threads_when_preloaded:
        return (
            f"the launcher runs {now} threads, {threads_when_preloaded} once it had imported "
            "(a fork could inherit a lock a new thread holds)"
        )
    return None


def _ranks_get_the_agents_environment() -> str | None:
    """A forked rank starts from its agent's environment as it is when the agent starts it
    (torchrun's own additions included, ``TORCHELASTIC_SIGNALS_TO_HANDLE``,
    ``OMP_NUM_THREADS``); one forked by the zygote would start from the agent's before
    torchrun ran. So the agent hands each rank its whole environment, with the rank's own
    variables over it (torch's ``_wrap`` sets them in the rank)."""
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError as exc:
        return f"torchrun's process contexts are not where this looks for them ({exc})"
    context = getattr(api, "MultiprocessContext", None)
    original = getattr(context, "_start", None)
    if context is None or original is None:
        return "torchrun's MultiprocessContext has no _start to hand the ranks their environment"
    if getattr(original, "hands_the_agents_environment", False):
        return None

    def _start(self: Any) -> Any:
        if self.start_method == START_METHOD:
            agent = dict(os.environ)
            self.envs = {rank: {**agent, **env} for rank, env in self.envs.items()}
        return original(self)

    _start.hands_the_agents_environment = True  # type: ignore[attr-defined]  # (our marker)
    context._start = _start
    return None


def threads() -> int:
    """How many threads this process runs (-1: unknown)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def _serve(listener_fd: int, alive_r: int, alive_w: int, parent: int) -> None:
    code = 0
    try:
        os.close(alive_w)  # (the agent's and its ranks' copies keep the zygote alive)
        exit_with_parent(parent)
        # A SIGTERM to the whole group (a drain, systemd's control-group kill) must not end the
        # zygote: its death would SIGKILL the ranks (their parent-death signal) before they
        # checkpoint. It ends with the launcher, or once the agent and every rank are gone.
        for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(number, signal.SIG_IGN)
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(15, b"ace3-zygote", 0, 0, 0)  # PR_SET_NAME
        forkserver.main(listener_fd, alive_r, [])
    except SystemExit:  # (the agent and every rank are gone)
        pass
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os._exit(code)
