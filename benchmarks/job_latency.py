"""Where the seconds of one tiny remote job go, warm against cold: its phases, end to end.

The job is one trial of the document's manual search (the digits MLP, 3 epochs, batch 64):
what the conformance snippets run some 80 times, with 1 and with 2 processes. Two services run
side by side, the same settings but one: ``ACE3_WARM_LAUNCH`` true (each worker slot keeps a
sandbox whose launcher has imported torch and the engine: the warm path) and false (every job
starts its sandbox and torchrun when claimed: the cold path). Their jobs alternate, each on a
quiet machine (the next starts once the CPUs were idle for half a second, at most 20 s later,
so the warm service's next launcher has finished importing). Each phase is read where it
happens: the client's clock for what the SDK sees (the job's live events), the server's
timestamps for the rest (the job row, its stored log lines and metrics), on the same machine:

    submit      trainer.train() returned (the job is stored and published)
    claimed     the SDK saw ``starting``: a worker claimed the message
    launched    the job's ``started_at``: the worker started (or handed the job to) torchrun
    ranks up    rank 0's ``ready:`` log line: torch imported, process group joined
    1st metric  the first metric stored
    rank done   rank 0's ``done:`` log line: trained, checkpointed, about to leave
    finished    the job's ``finished_at``: the worker recorded the outcome
    SDK sees    the ``end`` event reached the client

Both services are ``ace3 up`` with the test suite's stack settings (2 worker slots, 1 s
heartbeat), on its defaults (SQLite and the filesystem broker: what a newcomer runs) and on
PostgreSQL and Redis (a private database each, from ``ACE3_TEST_DATABASE_ADMIN_URL``)::

    .venv/bin/python benchmarks/job_latency.py [--runs 5] [--backends sqlite,postgres]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import ace3

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "digits"))
sys.path.insert(0, str(REPO))

from data import write_digits  # noqa: E402

from benchmarks.stack import service  # noqa: E402

# The tests' stack (tests/conftest.py::stack), where it matters to a job's latency.
TEST_STACK_ENV = {
    "ACE3_HEARTBEAT_SECONDS": "1",
    "ACE3_LEASE_SECONDS": "15",
    "ACE3_WORKER_SLOTS": "2",
    "ACE3_WORKER_DEVICE": "cpu",
    "ACE3_WORKER_CPU_PROCESSES": "8",
    "ACE3_LOG_LEVEL": "info",
}
PATHS = {"warm": "true", "cold": "false"}
PHASES = [
    "submit",
    "claimed",
    "launched",
    "ranks up",
    "1st metric",
    "rank done",
    "finished",
    "SDK sees",
]
# The goals for the warm path (medians, seconds after train() was called).
GOALS = {("1st metric", 1): 1.5, ("1st metric", 2): 2.0, ("SDK sees", 1): 2.5, ("SDK sees", 2): 2.5}
QUIET_IDLE_SHARE = 0.8  # the CPUs' idle share over QUIET_WINDOW that counts as quiet
QUIET_WINDOW = 0.5
QUIET_MAX_WAIT = 20.0


def wall(value: datetime | None) -> float:
    assert value is not None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def cpu_ticks() -> tuple[int, int]:
    """The whole machine's CPU time since boot, all cores (/proc/stat, in clock ticks):
    (idle + iowait, all)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def _cpu_idle_share(window: float) -> float:
    idle, total = cpu_ticks()
    time.sleep(window)
    idle2, total2 = cpu_ticks()
    return (idle2 - idle) / max(1, total2 - total)


def wait_until_quiet() -> None:
    deadline = time.monotonic() + QUIET_MAX_WAIT
    while time.monotonic() < deadline and _cpu_idle_share(QUIET_WINDOW) < QUIET_IDLE_SHARE:
        pass


def one_job(
    client: ace3.Client, model: ace3.ModelRef, dataset: ace3.DatasetRef, nproc: int
) -> dict[str, float]:
    """Each phase's end, in seconds after ``train()`` was called."""
    config = ace3.TrainingConfig(
        learning_rate=1e-3, batch_size=64, weight_decay=0.01, num_gpus=nproc
    )
    started = time.time()
    handle = ace3.Trainer(config).train(model, dataset, wait=False)
    seen = {"submit": time.time()}
    for event in handle.stream_events():
        if event.type == "state" and event.data.state == "starting":
            seen.setdefault("claimed", time.time())
        if event.type == "end":
            seen["SDK sees"] = time.time()
            break
    job = handle.refresh()
    if job.state != "succeeded":
        raise SystemExit(f"job {job.id} ended {job.state}: {job.error}")
    logs = list(client.jobs.iter_logs(job.id))
    ready = next(line for line in logs if "ready: world_size=" in line.line)
    done = next(line for line in logs if line.line.startswith("done: train_loss="))
    path = next(
        line.line for line in logs if line.line.startswith("ace3: ") and "start" in line.line
    )
    first_metric = min(wall(metric.created_at) for metric in handle.metrics())
    at = {
        **seen,
        "launched": wall(job.started_at),
        "ranks up": wall(ready.created_at),
        "1st metric": first_metric,
        "rank done": wall(done.created_at),
        "finished": wall(job.finished_at),
    }
    # A job claimed and started within one poll of the event stream shows no ``starting``.
    at.setdefault("claimed", at["launched"])
    result = {phase: at[phase] - started for phase in PHASES}
    result["warm"] = float(path.startswith("ace3: warm start"))
    return result


class Service:
    """One of the two services: a client with the model and data uploaded."""

    def __init__(self, name: str, client: ace3.Client, train: Path) -> None:
        self.name = name
        self.client = client
        self.model = client.load_model(REPO / "tests" / "conformance" / "assets" / "model.py")
        self.dataset = client.load_dataset(train)

    def job(self, nproc: int) -> dict[str, float]:
        ace3.set_default_client(self.client)
        return one_job(self.client, self.model, self.dataset, nproc)


@contextlib.contextmanager
def services(backend: str, train: Path) -> Iterator[dict[str, Service]]:
    """The warm and the cold service on ``backend``, both running."""
    with contextlib.ExitStack() as stack:
        running = {}
        for number, (name, warm) in enumerate(PATHS.items()):
            env = {**TEST_STACK_ENV, "ACE3_WARM_LAUNCH": warm}
            if backend == "postgres":
                from benchmarks.pg_stack import database

                env["ACE3_DATABASE_URL"] = stack.enter_context(database())
                env["ACE3_BROKER_URL"] = f"redis://127.0.0.1:6379/{12 + number}"
                env["ACE3_QUEUE_NAME"] = f"ace3-bench-{secrets.token_hex(4)}"
            base_url, key = stack.enter_context(service(env))
            client = stack.enter_context(ace3.Client(api_key=key, base_url=base_url))
            running[name] = Service(name, client, train)
        yield running


def _median(rows: list[dict[str, float]], phase: str) -> float:
    return statistics.median(row[phase] for row in rows)


def report(backend: str, nproc: int, rows: dict[str, list[dict[str, float]]]) -> None:
    warm_share = sum(row["warm"] for row in rows["warm"]) / len(rows["warm"])
    print(f"\n{backend}, {nproc} process(es): medians of {len(rows['warm'])} jobs each "
          f"(seconds since train() was called; warm path taken by {warm_share:.0%} of the warm "
          "service's jobs)")  # fmt: skip
    print(f"{'phase':<12}{'warm':>8}{'cold':>8}{'cold/warm':>11}   "
          f"{'warm len':>9}{'cold len':>9}   goal")  # fmt: skip
    before = None
    for phase in PHASES:
        warm, cold = _median(rows["warm"], phase), _median(rows["cold"], phase)
        lengths = [
            value - (_median(rows[name], before) if before else 0.0)
            for name, value in (("warm", warm), ("cold", cold))
        ]
        goal = GOALS.get((phase, nproc))
        verdict = "" if goal is None else f"<= {goal:g} s: {'met' if warm <= goal else 'NOT met'}"
        print(f"{phase:<12}{warm:>8.2f}{cold:>8.2f}{cold / warm:>11.2f}   "
              f"{lengths[0]:>9.2f}{lengths[1]:>9.2f}   {verdict}")  # fmt: skip
        before = phase


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        train, _ = write_digits(Path(tmp))
        for backend in args.backends.split(","):
            with services(backend, train) as running:
                results: dict[int, dict[str, list[dict[str, float]]]] = {}
                for service_ in running.values():  # (warm-up: the worker's own first imports)
                    service_.job(1)
                for nproc, _ in itertools.product((1, 2), range(args.runs)):
                    for name, service_ in running.items():
                        wait_until_quiet()
                        results.setdefault(nproc, {}).setdefault(name, []).append(
                            service_.job(nproc)
                        )
            for nproc, rows in results.items():
                report(backend, nproc, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
