"""A stranger's model file attacks the service from inside its job, on the production path (the
real API, Postgres, Redis, a Celery worker running as root, torchrun in the sandbox); every
attack must fail, and the service must stay whole.

All the attack jobs are submitted at once (the worker runs two at a time) and each test waits
for its own. The attacks, in ``tests/security/hostile.py``: service secrets in any process's
environment, the database and broker over the network, another owner's stored files, writing
the job's own inputs, forged checkpoint records (a path outside the job, a step beyond the plan,
a link), a fork bomb, sleeping forever, 100 MB of output; and signals: SIGTERM must reach the
ranks and the kill every process, detached ones included.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

import ace3
from ace3.follow.job_handle import JobHandle
from tests.conftest import DigitsFiles, Stack
from tests.e2e.conftest import processes_of_job, wait_for
from tests.security import hostile

pytestmark = pytest.mark.slow

JOB_TIMEOUT = 180


@dataclass
class Attack:
    source: str
    config: dict[str, Any]
    kwargs: dict[str, Any]


@pytest.fixture(scope="module")
def sdk(stack: Stack) -> Iterator[ace3.Client]:
    key, _ = stack.create_key("attacker")
    with ace3.Client(api_key=key, base_url=stack.base_url) as client:
        yield client


@pytest.fixture(scope="module")
def other_owner_marker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Another owner's dataset, holding a marker the attacker looks for in every file."""
    marker = f"other-owner-secret-{secrets.token_hex(8)}"
    key, _ = stack.create_key("victim")
    path = tmp_path_factory.mktemp("victim") / "secret.csv"
    path.write_text(f"{marker},label\n1,1\n")  # (in the header: every cell is a number)
    with ace3.Client(api_key=key, base_url=stack.base_url) as victim:
        victim.load_dataset(path)
    return marker


@pytest.fixture(scope="module")
def victim_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file of the machine's (only root may read it) that a forged record names."""
    path = tmp_path_factory.mktemp("machine") / "victim.txt"
    path.write_text("a file of the worker's machine\n")
    path.chmod(0o600)
    return path


def _targets(stack: Stack, database_url: str, redis_url: str) -> list[tuple[str, int]]:
    from sqlalchemy.engine import make_url

    database = make_url(database_url)
    redis_host, redis_port = redis_url.removeprefix("redis://").split("/")[0].split(":")
    return [
        (database.host or "127.0.0.1", database.port or 5432),
        (redis_host, int(redis_port)),
        ("127.0.0.1", stack.port),
    ]


@pytest.fixture(scope="module")
def attacks(
    stack: Stack,
    database_url: str,
    redis_url: str,
    other_owner_marker: str,
    victim_file: Path,
) -> dict[str, Attack]:
    quick = {"batch_size": 64, "max_steps": 3, "log_interval": 1}
    return {
        "environ": Attack(hostile.PROBES, quick, {"attacks": ["environ"]}),
        "network": Attack(
            hostile.PROBES,
            quick,
            {"attacks": ["network"], "targets": _targets(stack, database_url, redis_url)},
        ),
        "files": Attack(
            hostile.PROBES,
            quick,
            {"attacks": ["files"], "data_dir": str(stack.root), "marker": other_owner_marker},
        ),
        "inputs": Attack(hostile.PROBES, quick, {"attacks": ["inputs"]}),
        "checkpoints": Attack(
            hostile.CHECKPOINTS, {**quick, "save_interval": 1}, {"victim": str(victim_file)}
        ),
        "fork bomb": Attack(hostile.FORK_BOMB, quick, {"tries": 1500}),
        "sleeper": Attack(hostile.SLEEPER, {**quick, "max_runtime_seconds": 3}, {}),
        "flood": Attack(hostile.FLOOD, quick, {"megabytes": 100}),
    }


@pytest.fixture(scope="module")
def hostile_jobs(
    sdk: ace3.Client,
    digits_files: DigitsFiles,
    attacks: dict[str, Attack],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, JobHandle]:
    """Every attack submitted at once; each test waits for its own job."""
    directory = tmp_path_factory.mktemp("hostile")
    train = sdk.load_dataset(digits_files.train)
    handles = {}
    for name, attack in attacks.items():
        path = directory / f"{name.replace(' ', '_')}.py"
        path.write_text(hostile.model_source(attack.source))
        handles[name] = ace3.Trainer(ace3.TrainingConfig(**attack.config)).train(
            sdk.load_model(path),
            train,
            epochs=1,
            model_kwargs=attack.kwargs,
            wait=False,
        )
    return handles


def _finished(sdk: ace3.Client, handle: JobHandle) -> ace3.client.types.Job:
    wait_for(
        lambda: handle.refresh().state in ("succeeded", "failed", "cancelled"),
        JOB_TIMEOUT,
        f"job {handle.id} to finish",
    )
    return sdk.jobs.retrieve(handle.id)


def _lines(sdk: ace3.Client, job_id: str) -> list[str]:
    return [line.line for line in sdk.jobs.iter_logs(job_id)]


def _verdict(sdk: ace3.Client, job_id: str, name: str) -> tuple[str, str]:
    found = hostile.verdicts(_lines(sdk, job_id))
    assert name in found, f"the {name} attack reported nothing: {_lines(sdk, job_id)[-20:]}"
    return found[name]


def _warnings(sdk: ace3.Client, job_id: str) -> list[str]:
    return [line.line for line in sdk.jobs.iter_logs(job_id) if line.stream == "service"]


@pytest.mark.parametrize("attack", ["environ", "network", "files", "inputs"])
def test_a_job_reaches_no_secret_no_service_and_no_other_file(
    sdk: ace3.Client, hostile_jobs: dict[str, JobHandle], attack: str
) -> None:
    job = _finished(sdk, hostile_jobs[attack])
    state, detail = _verdict(sdk, job.id, attack)
    assert state == "blocked", f"{attack}: {detail}"
    assert job.state == "succeeded", job.error
    assert not processes_of_job(job.id)


def test_a_job_cannot_change_its_stored_inputs(
    sdk: ace3.Client, hostile_jobs: dict[str, JobHandle], stack: Stack, database_url: str
) -> None:
    job = _finished(sdk, hostile_jobs["inputs"])
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            stored = connection.execute(
                text(
                    "SELECT d.storage_key, d.sha256 FROM datasets d JOIN jobs j "
                    "ON j.dataset_id = d.id WHERE j.id = :id UNION ALL "
                    "SELECT m.storage_key, m.sha256 FROM models m JOIN jobs j "
                    "ON j.model_id = m.id WHERE j.id = :id"
                ),
                {"id": job.id},
            ).all()
    finally:
        engine.dispose()
    assert len(stored) == 2
    for storage_key, sha256 in stored:
        data = (stack.root / "storage" / storage_key).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha256, f"{storage_key} was changed"


def test_forged_checkpoint_records_are_refused_and_touch_nothing(
    sdk: ace3.Client, hostile_jobs: dict[str, JobHandle], victim_file: Path
) -> None:
    job = _finished(sdk, hostile_jobs["checkpoints"])
    assert job.state == "succeeded", job.error
    assert victim_file.read_text() == "a file of the worker's machine\n", "never deleted"
    steps = [checkpoint.step for checkpoint in sdk.jobs.checkpoints(job.id)]
    assert steps and max(steps) <= 3, f"only the run's own checkpoints are stored: {steps}"
    for checkpoint in sdk.jobs.checkpoints(job.id):
        assert checkpoint.name.startswith("step-0000000")
    warnings = "\n".join(_warnings(sdk, job.id))
    assert "is not /job/output/checkpoints/step-00000002.pt" in warnings
    assert "step 99999999 is beyond the 3 steps the run planned" in warnings
    assert "step-00000000.pt cannot be read" in warnings
    assert "refused an events record" in warnings
    assert "could read the victim file" not in "\n".join(_lines(sdk, job.id))


def test_a_fork_bomb_is_stopped_by_the_process_limit_and_leaves_nothing(
    sdk: ace3.Client, hostile_jobs: dict[str, JobHandle], stack: Stack
) -> None:
    job = _finished(sdk, hostile_jobs["fork bomb"])
    state, detail = _verdict(sdk, job.id, "fork bomb")
    assert state == "blocked", detail
    assert job.state == "failed", job.error
    assert job.attempt == 1, _warnings(sdk, job.id)
    assert "processes and threads" in (job.error or ""), job.error
    wait_for(lambda: not processes_of_job(job.id), 10, "every forked process to be killed")
    assert stack.worker_alive()


def test_a_job_that_sleeps_forever_ends_at_max_runtime(
    sdk: ace3.Client, hostile_jobs: dict[str, JobHandle]
) -> None:
    job = _finished(sdk, hostile_jobs["sleeper"])
    assert job.state == "failed" and job.attempt == 1, "stopped, and not retried"
    assert "max_runtime_seconds=3" in (job.error or ""), job.error
    assert job.started_at is not None and job.finished_at is not None
    assert (job.finished_at - job.started_at).total_seconds() < 60
    assert not processes_of_job(job.id)


def test_100_mb_of_output_is_capped_and_starves_nothing(
    sdk: ace3.Client, hostile_jobs: dict[str, JobHandle], database_url: str
) -> None:
    job = _finished(sdk, hostile_jobs["flood"])
    assert job.state == "succeeded" and job.attempt == 1, job.error
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            count, size = connection.execute(
                text("SELECT count(*), coalesce(sum(length(line)), 0) FROM job_logs "
                     "WHERE job_id = :id"),
                {"id": job.id},
            ).one()  # fmt: skip
    finally:
        engine.dispose()
    assert count < 20_000 and size < 20 * 1024 * 1024, (count, size)
    assert any("log lines dropped" in line for line in _warnings(sdk, job.id))


def test_cancel_reaches_every_rank_with_sigterm_and_then_kills_everything(
    sdk: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    marker = f"ace3-detached-{secrets.token_hex(6)}"
    path = tmp_path / "signals.py"
    path.write_text(hostile.model_source(hostile.SIGNALS))
    handle = ace3.Trainer(ace3.TrainingConfig(num_gpus=2, batch_size=64)).train(
        sdk.load_model(path),
        sdk.load_dataset(digits_files.train),
        epochs=1,
        model_kwargs={"marker": marker},
        wait=False,
    )

    def ranks_ready() -> bool:
        return sum(" ready" in line for line in _lines(sdk, handle.id)) >= 2

    wait_for(ranks_ready, JOB_TIMEOUT, "both ranks to start")
    assert _marked(marker), "the detached grandchild runs"
    handle.cancel()
    job = _finished(sdk, handle)
    assert job.state == "cancelled"
    lines = _lines(sdk, job.id)
    assert {line for line in lines if "got SIGTERM" in line} == {
        "rank 0 got SIGTERM",
        "rank 1 got SIGTERM",
    }
    wait_for(lambda: not processes_of_job(job.id), 10, "every process of the job to exit")
    assert not _marked(marker), "the detached process was killed with the job"


def _marked(marker: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry.name))
    return found
