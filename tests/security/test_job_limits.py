"""Per-job disk and memory limits on the production path (the real API, Postgres, Redis, a
Celery worker running as root, torchrun in the bubblewrap sandbox as a uid of its own), on a
stack of their own whose worker has small limits and measures every 0.1 s:

- a job writing as fast as it can is stopped soon past ``ACE3_JOB_DISK_BYTES`` (how soon is
  measured against the documented bound: its write rate times the interval, plus a
  measurement's and a kill's latency), fails without a retry, leaves no file behind, and the
  next job on the worker succeeds;
- a job of two ranks that each hold less than ``ACE3_JOB_MEMORY_BYTES`` (each rank's own
  ``RLIMIT_DATA``) but more together is stopped with the out-of-memory reason.

This machine has cgroup v1 only: the worker measures (PSS), as it does wherever no delegated
cgroup v2 directory is configured.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

import ace3
from ace3.follow.job_handle import JobHandle
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_server.services.keys import create_key
from tests.conftest import DigitsFiles, Stack, _stop, free_port, fresh_database, stack_env
from tests.e2e.conftest import processes_of_job, wait_for
from tests.security import hostile

pytestmark = pytest.mark.slow

MIB = 1 << 20
DISK_LIMIT = 64 * MIB
MEMORY_LIMIT = 1536 * MIB
HOG_MEGABYTES = 900  # per rank: under MEMORY_LIMIT alone (with torch's own), over it together
CHECK_SECONDS = 0.1
# What a loaded test machine adds to the bound: the measurement's walk, the thread's turn, the
# kill (the documented bound is the write rate times the interval plus these).
LATENCY_SECONDS = 0.5
JOB_TIMEOUT = 120


class Limited(NamedTuple):
    stack: Stack
    client: ace3.Client
    train: ace3.DatasetRef


@pytest.fixture(scope="module")
def limited(
    redis_url: str, digits_files: DigitsFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Limited]:
    """The stack, its worker with one slot: the jobs run one after the other, each in the
    sandbox prepared while the one before ran (the fewest torch imports: the fastest here)."""
    root = tmp_path_factory.mktemp("limits-stack")
    with fresh_database() as database_url:
        port = free_port()
        env = stack_env(root, database_url, redis_url) | {
            "ACE3_JOB_DISK_BYTES": str(DISK_LIMIT),
            "ACE3_JOB_MEMORY_BYTES": str(MEMORY_LIMIT),
            "ACE3_JOB_USAGE_CHECK_SECONDS": str(CHECK_SECONDS),
            "ACE3_WORKER_SLOTS": "1",
        }
        stack = Stack(f"http://127.0.0.1:{port}", port, env, root)
        stack.start_worker()
        try:
            key = _key(database_url)
            stack.start_api()
            with ace3.Client(api_key=key, base_url=stack.base_url) as client:
                yield Limited(stack, client, client.load_dataset(digits_files.train))
        finally:
            stack.kill_worker()  # (nothing of it is worth a clean shutdown's seconds)
            _stop(stack.processes["api"])
            shutil.rmtree(root / "jobs", ignore_errors=True)


def _key(database_url: str) -> str:
    """An API key, made in the database directly (no CLI to start)."""
    engine = make_sync_engine(database_url, pooled=False)
    try:
        with sync_session_factory(engine)() as session:
            return create_key(session, "limits").plaintext
    finally:
        engine.dispose()


def _model(limited: Limited, folder: Path, name: str, attack: str) -> ace3.ModelRef:
    path = folder / f"{name}.py"
    path.write_text(hostile.model_source(attack))
    return limited.client.load_model(path)


def _finished(limited: Limited, handle: JobHandle) -> ace3.client.types.Job:
    wait_for(
        lambda: handle.refresh().state in ("succeeded", "failed", "cancelled"),
        JOB_TIMEOUT,
        f"job {handle.id} to finish",
    )
    return limited.client.jobs.retrieve(handle.id)


def _lines(limited: Limited, job_id: str) -> list[str]:
    return [line.line for line in limited.client.jobs.iter_logs(job_id)]


def test_a_job_filling_the_disk_is_stopped_soon_past_its_limit_and_the_next_job_runs(
    limited: Limited, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    stack, client = limited.stack, limited.client
    trainer = ace3.Trainer(ace3.TrainingConfig(batch_size=64, max_steps=3))
    filler = _model(limited, tmp_path, "filler", hostile.DISK_FILLER)
    job = _finished(limited, trainer.train(filler, limited.train, epochs=1, wait=False))
    assert job.state == "failed" and job.attempt == 1, "stopped, and not retried"
    seen = re.match(
        r"training stopped: the job's files passed ACE3_JOB_DISK_BYTES: its output, home and "
        rf"temporary directories held (\d+) bytes, the limit is {DISK_LIMIT}$",
        job.error or "",
    )
    assert seen, job.error

    progress = [
        (int(match[1]), float(match[2]))
        for line in _lines(limited, job.id)
        if (match := re.search(r"ACE3-FILL (\d+) ([\d.]+)", line))
    ]
    assert len(progress) >= 2, progress
    (first, started), (written, ended) = progress[0], progress[-1]
    rate = (written - first) / max(ended - started, 1e-6)  # bytes a second
    peak = max(int(seen[1]), written)
    overshoot = peak - DISK_LIMIT
    bound = rate * (CHECK_SECONDS + LATENCY_SECONDS)
    print(
        f"\ndisk limit {DISK_LIMIT >> 20} MiB: written at {rate / MIB:.0f} MiB/s, seen "
        f"{int(seen[1]) / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB, overshoot "
        f"{overshoot / MIB:.0f} MiB (bound {bound / MIB:.0f} MiB)"
    )
    assert 0 < overshoot <= bound, (overshoot, bound)

    wait_for(lambda: not (stack.root / "jobs" / job.id).exists(), 10, "its files to be removed")
    wait_for(lambda: not processes_of_job(job.id), 10, "its processes to be gone")
    model = client.load_model(digits_files.model)
    following = _finished(limited, trainer.train(model, limited.train, epochs=1, wait=False))
    assert following.state == "succeeded", following.error
    assert stack.worker_alive()
    assert "could not measure" not in stack.log_tail("worker", 2000)


def test_a_job_whose_ranks_together_pass_the_memory_limit_is_stopped(
    limited: Limited, tmp_path: Path
) -> None:
    hog = _model(limited, tmp_path, "hog", hostile.MEMORY_HOG)
    config = ace3.TrainingConfig(num_gpus=2, batch_size=64, dynamic_batch_size=False)
    handle = ace3.Trainer(config).train(
        hog, limited.train, epochs=1, model_kwargs={"megabytes": HOG_MEGABYTES}, wait=False
    )
    job = _finished(limited, handle)
    assert job.state == "failed" and job.attempt == 1, job.error
    used = re.match(
        r"training stopped: out of memory: the job's processes used (\d+) bytes, the limit is "
        rf"{MEMORY_LIMIT} \(ACE3_JOB_MEMORY_BYTES\)$",
        job.error or "",
    )
    assert used and int(used[1]) > MEMORY_LIMIT, job.error
    lines = _lines(limited, job.id)
    assert any(f"rank 0 holds {HOG_MEGABYTES} MiB" in line for line in lines), lines[-20:]
    assert not any("MemoryError" in line or "Cannot allocate" in line for line in lines), (
        "no process met its own limit"
    )
    assert any("ace3: stopping the attempt: out of memory" in line for line in lines)
    wait_for(lambda: not processes_of_job(job.id), 10, "its processes to be gone")
    assert limited.stack.worker_alive()
    assert "could not measure" not in limited.stack.log_tail("worker", 2000)
