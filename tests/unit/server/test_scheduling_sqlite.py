"""The fair queue's quota on SQLite (the embedded mode, where ``FOR UPDATE`` means nothing): two
slots that claim at once for an owner with ``max_running_jobs=1`` never both claim, even when
both would read the owner's count before either writes."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from ace3_control import scheduling
from ace3_control.capacity import Capacity
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobState, Owner
from ace3_control.settings import Settings
from ace3_server.migrations_check import upgrade
from tests.conftest import insert_job


def test_two_slots_claiming_at_once_keep_the_owner_s_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = Settings(data_dir=tmp_path).resolved_database_url
    upgrade(url)
    engine = make_sync_engine(url)
    sessions = sync_session_factory(engine)
    with sessions() as session:
        first: Job = insert_job(session, num_processes=2, config={"num_gpus": 2})
        second = Job(
            owner_id=first.owner_id,
            model_id=first.model_id,
            dataset_id=first.dataset_id,
            config={},
            model_kwargs={},
            num_processes=1,
            request_hash="h",
        )
        session.add(second)
        session.execute(update(Owner).values(max_running_jobs=1))
        session.commit()
        ids = {first.id, second.id}

    # Both claims read the owner's count, then wait for each other (a second at most) before
    # claiming: the interleaving in which a count read outside the write transaction lets both
    # claim. With the write lock taken first, the second waits for the first's commit instead.
    both_counted = threading.Barrier(2, timeout=1.0)
    check = scheduling._owner_over_quota

    def counted_then_wait(session: Any, owner_id: str, num_processes: int) -> bool:
        over = check(session, owner_id, num_processes)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_counted.wait()
        return over

    monkeypatch.setattr(scheduling, "_owner_over_quota", counted_then_wait)
    claimed: list[Any] = []

    def claim(worker: str, processes: int) -> None:
        with sessions() as session:
            claimed.append(scheduling.claim_next(session, Capacity("cpu", processes), worker, 60))
            session.commit()

    # (Slots of different sizes: the small one skips the first job and claims the second, so
    # the two claims do not meet on one job's row.)
    slots = [threading.Thread(target=claim, args=(f"slot-{n}", 2 - n)) for n in range(2)]
    for slot in slots:
        slot.start()
    for slot in slots:
        slot.join(60)
    assert len([c for c in claimed if c is not None and c.job_id in ids]) == 1
    with sessions() as session:
        states = sorted(str(session.get(Job, job_id).state) for job_id in ids)  # type: ignore[union-attr]
    assert states == [JobState.QUEUED, JobState.STARTING]
    engine.dispose()
