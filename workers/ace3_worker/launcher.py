"""The torchrun command line and the environment the ranks get (no service credentials).

The command is what runs inside the job's sandbox (:mod:`ace3_worker.sandbox`), which wraps it;
``job_file`` is the job file's path as the job sees it.
"""

from __future__ import annotations

import math
import os

from ace3.runtime.process.torchrun import COMMAND as TORCHRUN
from ace3.runtime.process.warm_launcher import WARM_RANK_ARGS

# Only these variables reach user code: no database, broker or API settings (ACE3_* are dropped).
# PATH, HOME and TMPDIR are set by the sandbox to what the job sees.
_PASSED_THROUGH = ("PATH", "HOME", "LANG", "TMPDIR", "LD_LIBRARY_PATH", "TZ")
_PASSED_PREFIXES = ("LC_", "CUDA_", "NCCL_", "NVIDIA_", "OMP_", "MKL_", "TORCH_", "GLOO_")


def rank_environment(
    device: str, nproc_per_node: int, worker_slots: int = 1, base: dict[str, str] | None = None
) -> dict[str, str]:
    """The ranks' environment. Unless set, OMP_NUM_THREADS shares this machine's cores among
    every rank of every job the worker may run at once: oversubscribed OpenMP threads spin
    against each other (two 2-thread jobs on 2 cores trained 14x slower than two 1-thread ones).
    """
    source = os.environ if base is None else base
    env = {
        key: value
        for key, value in source.items()
        if key in _PASSED_THROUGH or key.startswith(_PASSED_PREFIXES)
    }
    env["ACE3_DEVICE"] = device
    env["PYTHONUNBUFFERED"] = "1"
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(
            max(1, (os.cpu_count() or 1) // (nproc_per_node * worker_slots))
        )
    return env


# torchrun's own default: how long it waits for its ranks after it passes them a SIGTERM.
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
# How often torchrun's agent looks at its ranks (its default, 0.1 s, is how late it may notice
# that they ended: a tiny job's whole training). A look costs a few microseconds.
MONITOR_INTERVAL = "--monitor-interval=0.02"


def _shutdown(seconds: float) -> str:
    """How long torchrun waits for its ranks after it passes them a SIGTERM (a cancel, the
    runtime limit, a preemption; or its own, after a rank failed) before it kills them: the
    ranks checkpoint on SIGTERM (ace3.runtime.loop.preemption), so the worker gives it its longest
    grace (ace3_worker.drain.shutdown_timeout); the worker's own SIGKILL comes first."""
    return f"--shutdown-timeout={math.ceil(seconds)}"


def _runtime(job_file: str) -> list[str]:
    return ["-m", "ace3.runtime", "--job", job_file]


def _standalone(nproc_per_node: int, shutdown_timeout: float) -> list[str]:
    """torchrun's options for a single node; its standalone mode picks a free rendezvous port
    itself."""
    return [
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc_per_node}",
        "--max-restarts=0",
        MONITOR_INTERVAL,
        _shutdown(shutdown_timeout),
    ]


def torchrun_command(
    job_file: str, nproc_per_node: int, shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
) -> list[str]:
    """Single-node launch (the cold path). torchrun is the worker's (``ace3.runtime.process.torchrun``:
    it ends without the interpreter's finalization, a second or more on a small machine)."""
    return [*TORCHRUN, *_standalone(nproc_per_node, shutdown_timeout), *_runtime(job_file)]


def warm_torchrun_args(
    job_file: str, nproc_per_node: int, shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT
) -> list[str]:
    """The same launch as :func:`torchrun_command` for a warm launcher's torchrun (its
    arguments only): each rank is a fork of the launcher that runs the engine as a function
    (:mod:`ace3.runtime.process.warm_launcher`) instead of a new ``python -m ace3.runtime``."""
    return [
        *_standalone(nproc_per_node, shutdown_timeout),
        *WARM_RANK_ARGS,
        "--job",
        job_file,
    ]


def multinode_torchrun_command(
    job_file: str,
    nproc_per_node: int,
    *,
    nnodes: int,
    endpoint: str,
    rendezvous_id: str,
    is_host: bool,
    local_addr: str,
    join_timeout: float,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
) -> list[str]:
    """One node of a multi-node launch: the nodes meet through torchrun's c10d rendezvous at
    ``endpoint`` (``host:port``), whose store the leader's torchrun hosts (``is_host``; the
    others connect to it). c10d assigns the global ranks (``--node-rank`` is only read by the
    static backend); ``local_addr`` is the address the other nodes reach this one at."""
    conf = f"is_host={'true' if is_host else 'false'},join_timeout={max(1, round(join_timeout))}"
    return [
        *TORCHRUN,  # (torchrun, with node descriptors apart: ACE3_NODE_ID)
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rendezvous_id}",
        f"--rdzv-conf={conf}",
        f"--local-addr={local_addr}",
        "--max-restarts=0",
        MONITOR_INTERVAL,
        _shutdown(shutdown_timeout),
        *_runtime(job_file),
    ]
