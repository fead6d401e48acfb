"""The worker's torchrun: torchrun as it is, with three changes.

It ends without the interpreter's finalization. Once torchrun's ``main`` returned (its ranks
exited, its rendezvous closed), tearing down the modules of an interpreter that imported torch
takes a second or more on a small machine (1.2 s of an 8 s job on 2 cores), while the worker
waits for the exit status. So it ends as the interpreter would (non-daemon threads joined,
``atexit`` handlers run, streams flushed; the same exit status; an uncaught exception printed
with its traceback, exit status 1), then ``os._exit``: the ranks do the same
(``ace3.runtime.__main__``).

A node of a multi-node job whose processes live in a PID namespace of their own gets node
descriptors apart: torchrun's c10d rendezvous tells nodes apart by ``(address, pid,
counter)``. In the job sandbox every node's torchrun has the same small PID (its namespace is
new), so two nodes of one job on the same machine (two workers of one host, or a test) would
look like one node rejoining and the rendezvous would never fill. ``ACE3_NODE_ID`` (set by the
worker: unique among the nodes of the machine) replaces the PID in the node's descriptor.

A single node (``--standalone``) skips the c10d rendezvous's random delay of up to 0.3 s before
its first round, which spreads the joins of many nodes over time: there are none to spread.

The worker starts it by its path (:data:`COMMAND`), not with ``-m``: that would import the
``ace3`` package (the SDK: pydantic, httpx, rich; about 0.6 s) into a process that only runs
torchrun. Standard library only until torchrun's own import::

    python .../ace3/runtime/process/torchrun.py [torchrun arguments]
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import Any, NoReturn

# How the worker starts it: ``COMMAND + [torchrun arguments]``.
COMMAND = [sys.executable, os.path.abspath(__file__)]


def _distinct_node_descriptors(node_id: int) -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    generator = dynamic_rendezvous._NodeDescGenerator
    original = generator.generate

    def generate(self: Any, local_addr: str | None = None) -> Any:
        desc = original(self, local_addr)
        return dynamic_rendezvous._NodeDesc(desc.addr, node_id, desc.local_id)

    generator.generate = generate


def _no_first_round_skew() -> None:
    """A single node (``--standalone``) meets nobody: skip the random 0-0.3 s that the c10d
    rendezvous waits before its first round to spread many nodes' joins over time."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    delay = dynamic_rendezvous._delay

    def skip_skew(seconds: float | tuple[float, float]) -> None:
        if not isinstance(seconds, tuple):  # (the first round's skew is the only range)
            delay(seconds)

    dynamic_rendezvous._delay = skip_skew


def _exit_status(exc: SystemExit) -> int:
    """The exit status the interpreter gives ``raise SystemExit(code)``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _leave(code: int) -> NoReturn:
    """End as the interpreter's shutdown would, less the teardown of its modules."""
    try:
        shutdown_threads = getattr(threading, "_shutdown", None)
        if shutdown_threads is None:  # (an interpreter without it: finalize as usual)
            sys.exit(code)
        shutdown_threads()  # (joins non-daemon threads, thread-pool executors' included)
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> NoReturn:
    """Run torchrun with ``argv`` (default: this process's arguments), then leave with its exit
    status. The warm launcher (:mod:`ace3.runtime.process.warm_launcher`) calls it too."""
    node_id = os.environ.get("ACE3_NODE_ID", "")
    if node_id.isdigit():
        try:
            _distinct_node_descriptors(int(node_id))
        except (ImportError, AttributeError) as exc:  # (a torch without these internals)
            print(f"ace3: node descriptors left as torchrun makes them ({exc})", file=sys.stderr)
    if "--standalone" in (sys.argv[1:] if argv is None else argv):
        try:
            _no_first_round_skew()
        except (ImportError, AttributeError) as exc:  # (a torch without these internals)
            print(f"ace3: the rendezvous keeps its first-round delay ({exc})", file=sys.stderr)
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv)
        code = 0
    except SystemExit as exc:
        code = _exit_status(exc)
    except KeyboardInterrupt:
        raise  # (the interpreter ends by SIGINT itself)
    except BaseException:  # an uncaught exception, as the interpreter reports it
        sys.excepthook(*sys.exc_info())
        code = 1
    _leave(code)


if __name__ == "__main__":
    # Started by its path, Python put this file's directory first on sys.path; ``-m`` would
    # have put the working directory there instead, as torchrun's own command does.
    sys.path[0] = os.getcwd()
    main()
