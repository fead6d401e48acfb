"""Owners' quotas: ``ace3 owners set-quota`` and ``list`` (in process, against Postgres), and on
the real stack (API, Postgres, Redis, a Celery worker with 2 slots, torchrun) a second job of an
owner with max_running_jobs=1 that stays queued (waiting_reason ``quota``) until the first ends,
then runs."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from sqlalchemy import delete, update

from ace3.cli import main
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobState, Owner
from ace3_control.settings import get_settings
from tests.conftest import DigitsFiles, Stack, insert_job


def _wait(client: httpx.Client, job_id: str, done: object, timeout: float = 90) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if done(job):  # type: ignore[operator]
            return job  # type: ignore[no-any-return]
        time.sleep(0.2)
    raise AssertionError(f"job {job_id}: timed out; last seen {job['state']}")


@pytest.fixture()
def cli(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[int, str, str]]]:
    """``ace3 ...`` in this process against the test database: (exit code, stdout, stderr)."""
    monkeypatch.setenv("ACE3_DATABASE_URL", database_url)
    get_settings.cache_clear()

    def run(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's usage errors
                code = int(exc.code or 0)
        return code, out.getvalue(), err.getvalue()

    yield run
    get_settings.cache_clear()


def test_set_quota_sets_lifts_and_refuses_bad_input(
    cli: Callable[..., tuple[int, str, str]], database_url: str
) -> None:
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        owner = Owner(name="quota-cli")
        session.add(owner)
        session.commit()
        owner_id = owner.id
    try:
        code, out, _ = cli("owners", "set-quota", owner_id, "--max-running-jobs", "1")
        assert code == 0 and f"owner {owner_id}: max_running_jobs=1 max_gpus=-" in out
        code, out, _ = cli("owners", "set-quota", owner_id, "--max-gpus", "8")
        assert code == 0 and "max_running_jobs=1 max_gpus=8" in out, "the other limit stays"
        code, out, _ = cli("owners", "set-quota", owner_id, "--max-priority", "high")
        assert code == 0 and "max_gpus=8 max_priority=high" in out
        code, out, _ = cli("owners", "list")
        line = next(row for row in out.splitlines() if row.startswith(owner_id))
        assert code == 0 and line.split()[-6:] == ["1", "8", "high", "0", "0", "0"]
        code, _, err = cli("owners", "set-quota", owner_id, "--max-priority", "urgent")
        assert code == 2 and "--max-priority" in err and "'urgent'" in err
        code, out, _ = cli("owners", "set-quota", owner_id, "--max-priority", "none")
        assert code == 0 and "max_priority=-" in out
        code, out, _ = cli("owners", "set-quota", owner_id, "--max-running-jobs", "none")
        assert code == 0 and "max_running_jobs=- max_gpus=8" in out
        code, _, err = cli("owners", "set-quota", owner_id, "--max-gpus", "-1")
        assert code == 2 and "--max-gpus" in err and "-1" in err
        code, _, err = cli("owners", "set-quota", "nobody", "--max-gpus", "2")
        assert code == 2 and "no owner with id 'nobody'" in err
        code, _, err = cli("owners", "set-quota", owner_id)
        assert code == 2 and "--max-running-jobs" in err
    finally:
        with sync_session_factory(engine)() as session:
            session.execute(delete(Owner).where(Owner.id == owner_id))
            session.commit()
        engine.dispose()


def test_a_job_over_its_owner_s_quota_waits_until_the_first_ends(
    stack: Stack, digits_files: DigitsFiles, database_url: str
) -> None:
    key, owner_id = stack.create_key("quota-owner")
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        session.execute(
            update(Owner).where(Owner.id == owner_id).values(max_running_jobs=1, max_gpus=2)
        )
        session.commit()

    with httpx.Client(
        base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        model = client.post("/v1/models", files={"file": ("m.py", digits_files.model.read_bytes())})
        data = client.post(
            "/v1/datasets", files={"file": ("t.npz", digits_files.train.read_bytes())}
        )
        body = {
            "model_id": model.json()["id"],
            "dataset_id": data.json()["id"],
            # (runs until cancelled: a job of a few steps ends before it is looked at)
            "config": {"epochs": 1000, "batch_size": 64, "num_gpus": 1, "validation_split": 0.0},
            "priority": "high",
        }
        bad_priority = client.post("/v1/jobs", json={**body, "priority": "urgent"})
        assert bad_priority.status_code == 422
        assert bad_priority.json()["detail"][0]["loc"] == ["body", "priority"]
        # "high" is an admin's grant (ACE3_DEFAULT_MAX_PRIORITY=normal): refused, then granted.
        not_granted = client.post("/v1/jobs", json=body)
        assert not_granted.status_code == 422, not_granted.text
        problem = not_granted.json()["detail"][0]
        assert problem["loc"] == ["body", "priority"] and "max_priority=normal" in problem["msg"]
        with sync_session_factory(engine)() as session:
            session.execute(update(Owner).where(Owner.id == owner_id).values(max_priority="high"))
            session.commit()
        engine.dispose()
        too_big = {**body, "config": {**body["config"], "num_gpus": 4}}
        refused = client.post("/v1/jobs", json=too_big)
        assert refused.status_code == 422, "larger than max_gpus=2: it could never run"
        problem = refused.json()["detail"][0]
        assert problem["loc"] == ["body", "config", "num_gpus"] and "max_gpus=2" in problem["msg"]
        first = client.post("/v1/jobs", json=body).json()
        second = client.post("/v1/jobs", json=body).json()
        assert first["priority"] == "high"

        _wait(client, first["id"], lambda job: job["state"] != "queued")
        waiting = client.get(f"/v1/jobs/{second['id']}").json()
        assert waiting["state"] == "queued", "the worker's second slot is free: only the quota"
        assert waiting["waiting_reason"] == "quota" and waiting["queue_position"] >= 1
        queue = client.get("/v1/queue").json()["data"]
        assert [(job["id"], job["waiting_reason"]) for job in queue] == [(second["id"], "quota")]

        # The first ends (cancelled: its training is not what is tested): the second runs.
        assert client.post(f"/v1/jobs/{first['id']}/cancel").status_code == 202
        done = _wait(client, first["id"], lambda job: job["state"] == "cancelled")
        ran = _wait(client, second["id"], lambda job: job["state"] != "queued")
        assert ran["state"] in ("starting", "running") and ran["attempt"] == 1
        assert ran["queue_position"] is None and ran["waiting_reason"] is None
        client.post(f"/v1/jobs/{second['id']}/cancel")
        ended = _wait(client, second["id"], lambda job: job["finished_at"] is not None)
        assert ended["state"] == "cancelled" and done["finished_at"] <= ended["finished_at"]


def test_limits_that_strand_queued_jobs_say_which(
    cli: Callable[..., tuple[int, str, str]], database_url: str
) -> None:
    """A queued job larger than the new max_gpus (or any, under max_running_jobs=0) could never
    run: it stays queued (nothing is failed behind the owner's back), and the command says so."""
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        # (Too large for the stack's worker: never claimed.)
        job = insert_job(session, num_processes=16, config={"num_gpus": 16})
        owner_id, job_id = job.owner_id, job.id
    try:
        code, _, err = cli("owners", "set-quota", owner_id, "--max-gpus", "32")
        assert code == 0 and err == ""
        code, _, err = cli("owners", "set-quota", owner_id, "--max-gpus", "8")
        assert code == 0 and "1 queued job(s)" in err and job_id in err and "max_gpus=8" in err
        code, _, err = cli("owners", "set-quota", owner_id, "--max-gpus", "none",
                           "--max-running-jobs", "0")  # fmt: skip
        assert code == 0 and job_id in err and "max_running_jobs=0" in err
        with sync_session_factory(engine)() as session:
            assert session.get(Job, job_id).state == JobState.QUEUED  # type: ignore[union-attr]
    finally:
        with sync_session_factory(engine)() as session:
            session.execute(delete(Job).where(Job.id == job_id))
            session.execute(delete(Owner).where(Owner.id == owner_id))
            session.commit()
        engine.dispose()
