"""Which workers can run a job: the fit rules shared by admission, the reconciler and the worker.

Each node of a job runs on one worker: ``num_gpus`` processes per node, and a job with
``num_nodes = N`` needs N different workers (one node each). A worker advertises a device kind
(``cuda`` or ``cpu``) and a device count: its GPUs, or on a CPU worker the processes it may run
(``ACE3_WORKER_CPU_PROCESSES``). A node fits a worker when the worker has at least as many
devices as the node has processes, and, for ``backend='nccl'``, is a CUDA worker.
``backend='auto'`` (nccl on CUDA workers, gloo on CPU workers) and ``'gloo'`` fit either kind.
A worker never runs a node with fewer processes than it asked for, and a multi-node job never
starts on fewer workers than it asked for: a job that fits nowhere waits, or is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

DEVICE_KINDS = ("cuda", "cpu")


class HasCapacity(Protocol):
    """A worker as the fit rules see it (a ``models.Worker`` row or a :class:`Capacity`)."""

    @property
    def device_kind(self) -> str: ...

    @property
    def device_count(self) -> int: ...


@dataclass(frozen=True)
class Capacity:
    """What one worker can run: ``device_count`` processes of one job on ``device_kind``."""

    device_kind: str
    device_count: int

    def __post_init__(self) -> None:
        if self.device_kind not in DEVICE_KINDS:
            raise ValueError(f"device_kind must be one of {DEVICE_KINDS}, not {self.device_kind!r}")
        if self.device_count < 0:
            raise ValueError(f"device_count must be >= 0, not {self.device_count}")


@dataclass(frozen=True)
class JobNeeds:
    """What a job asks of each worker that runs one of its nodes: ``processes`` per node, on
    ``nodes`` different workers."""

    processes: int
    backend: str = "auto"
    nodes: int = 1

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any) -> JobNeeds:
        """From a TrainingConfig, or its stored JSON (a job row's ``config``)."""
        if isinstance(config, Mapping):
            return cls(
                int(config.get("num_gpus", 1)),
                str(config.get("backend", "auto")),
                int(config.get("num_nodes", 1) or 1),
            )
        return cls(int(config.num_gpus), str(config.backend), int(config.num_nodes))

    @classmethod
    def from_job(cls, num_processes: int, config: Mapping[str, Any] | None) -> JobNeeds:
        """From a job row: its ``num_processes`` (every node's together) and stored config."""
        config = config or {}
        nodes = max(1, int(config.get("num_nodes", 1) or 1))
        return cls(max(1, int(num_processes) // nodes), str(config.get("backend", "auto")), nodes)


@dataclass(frozen=True)
class ClusterProblem:
    """Why no live worker can run a job: the config field to change and the message."""

    field: str  # "num_gpus", "backend" or "num_nodes"
    message: str


def describe(worker: HasCapacity) -> str:
    """``"2 GPUs"``, ``"1 GPU"``, ``"8 CPU processes"``: what a worker offers one job."""
    count = worker.device_count
    if worker.device_kind == "cuda":
        return f"{count} GPU" + ("" if count == 1 else "s")
    return f"{count} CPU process" + ("" if count == 1 else "es")


def fit_problem(needs: JobNeeds, worker: HasCapacity) -> str | None:
    """Why this one worker cannot run the job, or None when it can."""
    if needs.backend == "nccl" and worker.device_kind != "cuda":
        return f"backend='nccl' needs a CUDA worker, and this worker has {describe(worker)}"
    if needs.processes > worker.device_count:
        where = "one worker" if needs.nodes == 1 else "each of its workers"
        return (
            f"the job runs {needs.processes} processes on {where}, and this worker has "
            f"{describe(worker)}"
        )
    return None


def _summary(workers: Sequence[HasCapacity]) -> str:
    listed = ", ".join(describe(worker) for worker in workers[:5])
    more = f", and {len(workers) - 5} more" if len(workers) > 5 else ""
    return f"{len(workers)} live worker{'' if len(workers) == 1 else 's'}: {listed}{more}"


def cluster_problem(needs: JobNeeds, workers: Sequence[HasCapacity]) -> ClusterProblem | None:
    """Why none of ``workers`` (the live ones) could ever run the job; None when one can, or
    when no worker is registered at all (the job waits for workers that may come later)."""
    if not workers:
        return None
    candidates = list(workers)
    if needs.backend == "nccl":
        candidates = [worker for worker in workers if worker.device_kind == "cuda"]
        if not candidates:
            return ClusterProblem(
                "backend",
                "backend='nccl' needs a CUDA worker, and this cluster has none "
                f"({_summary(workers)}): use backend='auto' (gloo on CPU workers) or "
                "backend='gloo', or add a CUDA worker",
            )
    fitting = [worker for worker in candidates if worker.device_count >= needs.processes]
    if len(fitting) >= needs.nodes:
        return None
    if fitting:
        return _too_few_workers(needs, fitting, workers)
    largest = max(candidates, key=lambda worker: worker.device_count)
    kind = "CUDA worker" if needs.backend == "nccl" else "worker"
    fix = (
        f"use num_gpus <= {largest.device_count}, or add a larger worker"
        if largest.device_count >= 1
        else "add a worker with at least one device"
    )
    return ClusterProblem(
        "num_gpus",
        f"num_gpus={needs.processes} runs {needs.processes} processes on one worker, and the "
        f"largest live {kind} has {describe(largest)} ({_summary(workers)}): {fix}",
    )


def _too_few_workers(
    needs: JobNeeds, fitting: Sequence[HasCapacity], workers: Sequence[HasCapacity]
) -> ClusterProblem:
    """A multi-node job: some workers fit one node, but fewer than ``num_nodes`` of them."""
    count = len(fitting)
    kind = "CUDA worker" if needs.backend == "nccl" else "worker"
    return ClusterProblem(
        "num_nodes",
        f"num_nodes={needs.nodes} runs on {needs.nodes} different workers with "
        f"{needs.processes} process{'' if needs.processes == 1 else 'es'} each, and only "
        f"{count} live {kind}{'' if count == 1 else 's'} fit{'s' if count == 1 else ''} one node "
        f"({_summary(workers)}): use num_nodes <= {count}, or add workers",
    )
