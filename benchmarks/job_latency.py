"""Where the seconds of one tiny remote job go: its phases, end to end, on a running stack.

The job is one trial of the document's manual search (the digits MLP, 1 process, 3 epochs,
batch 64): what the conformance snippets run some 80 times. Each phase is read where it
happens: the client's clock for what the SDK sees (the job's live events), the server's
timestamps for the rest (the job row, its stored log lines and metrics), on the same machine:

    submit      trainer.train() returned (the job is stored and published)
    claimed     the SDK saw ``starting``: a worker claimed the message
    launched    the job's ``started_at``: the worker started torchrun (``running``)
    ranks up    rank 0's ``ready:`` log line: torch imported, process group joined
    1st metric  the first metric stored
    rank done   rank 0's ``done:`` log line: trained, checkpointed, about to leave
    finished    the job's ``finished_at``: the worker recorded the outcome
    SDK sees    the ``end`` event reached the client

Uses the service at ACE3_BASE_URL with ACE3_API_KEY when both are set; otherwise starts
``ace3 up`` in a temporary directory with the test suite's stack settings (2 worker slots,
1 s heartbeat); set ACE3_DATABASE_URL and ACE3_BROKER_URL to run it on PostgreSQL and Redis as
the tests do (else SQLite and the filesystem broker)::

    .venv/bin/python benchmarks/job_latency.py [--runs 5]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
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


def _wall(value: datetime | None) -> float:
    assert value is not None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def one_job(
    client: ace3.Client, model: ace3.ModelRef, dataset: ace3.DatasetRef
) -> dict[str, float]:
    """Each phase's end, in seconds after ``train()`` was called."""
    config = ace3.TrainingConfig(learning_rate=1e-3, batch_size=64, weight_decay=0.01)
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
    first_metric = min(_wall(metric.created_at) for metric in handle.metrics())
    at = {
        **seen,
        "launched": _wall(job.started_at),
        "ranks up": _wall(ready.created_at),
        "1st metric": first_metric,
        "rank done": _wall(done.created_at),
        "finished": _wall(job.finished_at),
    }
    # A job claimed and started within one poll of the event stream shows no ``starting``.
    at.setdefault("claimed", at["launched"])
    return {phase: at[phase] - started for phase in PHASES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with (
        service(TEST_STACK_ENV) as (base_url, key),
        ace3.Client(api_key=key, base_url=base_url) as client,
        tempfile.TemporaryDirectory() as tmp,
    ):
        ace3.set_default_client(client)
        train_path, _ = write_digits(Path(tmp))
        model = client.load_model(REPO / "tests" / "conformance" / "assets" / "model.py")
        dataset = client.load_dataset(train_path)
        one_job(client, model, dataset)  # (warm-up: the first job pays the worker's own imports)
        rows = [one_job(client, model, dataset) for _ in range(args.runs)]
    print(f"one tiny job (digits MLP, 1 process, 3 epochs), service at {base_url}")
    print("seconds since train() was called, at the end of each phase; then each phase's length")
    print("run  " + "  ".join(f"{phase:>10}" for phase in PHASES))
    median = {phase: statistics.median(row[phase] for row in rows) for phase in PHASES}
    for label, row in [*((str(i), r) for i, r in enumerate(rows, 1)), ("med", median)]:
        print(f"{label:<5}" + "  ".join(f"{row[phase]:>10.2f}" for phase in PHASES))
    lengths = [median[PHASES[0]]] + [
        median[phase] - median[before] for before, phase in itertools.pairwise(PHASES)
    ]
    print("len  " + "  ".join(f"{length:>10.2f}" for length in lengths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
