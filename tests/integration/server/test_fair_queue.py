"""The fair queue's SQL (``ace3_control.scheduling``) run directly against Postgres: claims follow
priority, then owners take turns (one with 50 queued jobs does not starve one with 1), quotas
keep a job queued with waiting_reason ``quota``, and gangs fill oldest first.

Each test works inside one transaction that first hides every other queued job of the session's
database (the real stack shares it) and is rolled back at the end: nothing is left behind. The
concurrent claims commit, so they run on a database of their own."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from ace3_control import scheduling
from ace3_control.capacity import Capacity
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.job_nodes import add_node
from ace3_control.models import Job, JobState, Owner, StoredDataset, StoredModel, utcnow
from tests.conftest import fresh_database

CPU = Capacity("cpu", 8)


@pytest.fixture()
def session(database_url: str) -> Iterator[Session]:
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        # Others' queued jobs out of sight (locked by this transaction, skipped by the stack's
        # worker), restored by the rollback.
        session.execute(
            update(Job).where(Job.state == JobState.QUEUED).values(state=JobState.CANCELLED)
        )
        try:
            yield session
        finally:
            session.rollback()
    engine.dispose()


class Jobs:
    """Owners and queued jobs in the test's transaction, each job queued a second after the
    one before."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.clock = utcnow() - timedelta(hours=1)

    def owner(self, name: str, **quota: Any) -> Owner:
        owner = Owner(name=name, **quota)
        self.session.add(owner)
        self.session.flush()
        common = {"owner_id": owner.id, "name": "x", "filename": "x", "size_bytes": 1,
                  "storage_key": "k", "sha256": owner.id.ljust(64, "0")}  # fmt: skip
        self.session.add(StoredModel(kind="file", factory="f", variant="f|", **common))
        self.session.add(StoredDataset(kind="file", format="npz", **common))
        self.session.flush()
        return owner

    def queue(
        self, owner: Owner, priority: str = "normal", processes: int = 1, nodes: int = 1
    ) -> str:
        self.clock += timedelta(seconds=1)
        model = self.session.scalar(select(StoredModel.id).where(StoredModel.owner_id == owner.id))
        data = self.session.scalar(
            select(StoredDataset.id).where(StoredDataset.owner_id == owner.id)
        )
        job = Job(
            owner_id=owner.id,
            model_id=model,
            dataset_id=data,
            priority=priority,
            config={"num_gpus": processes // nodes, "num_nodes": nodes},
            model_kwargs={},
            num_processes=processes,
            request_hash="h",
            queued_at=self.clock,
            enqueued_at=self.clock,
        )
        self.session.add(job)
        self.session.flush()
        return job.id

    def claim(self, capacity: Capacity = CPU, worker: str = "w") -> str | None:
        claimed = scheduling.claim_next(self.session, capacity, worker, 60)
        return None if claimed is None else claimed.job_id

    def end(self, job_id: str) -> None:
        self.session.execute(update(Job).where(Job.id == job_id).values(state=JobState.SUCCEEDED))

    def line(self) -> list[tuple[str, int, str]]:
        line = scheduling.waiting_line()
        rows = self.session.execute(
            select(line.c.id, line.c.position, line.c.waiting_reason).order_by(line.c.position)
        )
        return [(row.id, row.position, row.waiting_reason) for row in rows]


def test_claims_go_by_priority_then_owners_take_turns(session: Session) -> None:
    jobs = Jobs(session)
    busy, single, late, urgent = (jobs.owner(name) for name in ("busy", "single", "late", "urgent"))
    low = jobs.queue(late, "low")  # the oldest job, but low priority
    many = [jobs.queue(busy) for _ in range(50)]
    one = jobs.queue(single)  # queued after all 50
    high = jobs.queue(urgent, "high")  # the newest job, high priority

    line = jobs.line()
    assert [job_id for job_id, _, _ in line[:4]] == [high, many[0], one, many[1]]
    assert line[-1][0] == low and len(line) == 53
    assert [reason for _, _, reason in line[:2]] == ["capacity", "priority"]

    # One worker slot, jobs ending one by one: the single job goes second after the high one.
    order = []
    for _ in range(4):
        claimed = jobs.claim()
        assert claimed is not None
        order.append(claimed)
        jobs.end(claimed)
    assert order == [high, many[0], one, many[1]]
    # With every slot kept busy the turns alternate as well: the owner served longest ago first.
    second = jobs.owner("second")
    theirs = [jobs.queue(second) for _ in range(2)]
    running = [jobs.claim() for _ in range(4)]
    assert running == [theirs[0], many[2], theirs[1], many[3]]
    # A worker too small for a job passes it over and claims the next one that fits it.
    big = jobs.queue(jobs.owner("big"), "high", processes=16)
    assert jobs.claim() == many[4]
    assert jobs.claim(Capacity("cpu", 16)) == big


def test_a_job_over_its_owner_s_quota_waits_until_the_first_ends(session: Session) -> None:
    jobs = Jobs(session)
    capped = jobs.owner("capped", max_running_jobs=1)
    first, second = jobs.queue(capped), jobs.queue(capped)
    gpus = jobs.owner("gpus", max_gpus=4)
    three, two, one = jobs.queue(gpus, processes=3), jobs.queue(gpus, processes=2), jobs.queue(gpus)

    assert jobs.claim() == first
    assert jobs.claim() == three
    reasons = {job_id: reason for job_id, _, reason in jobs.line()}
    assert reasons == {second: "quota", two: "quota", one: "capacity"}
    assert jobs.claim() == one  # 3 + 1 processes fit max_gpus=4, 3 + 2 would not
    assert jobs.claim() is None, "over quota: nothing to claim, and nothing is failed"
    assert session.get(Job, second).state == JobState.QUEUED  # type: ignore[union-attr]

    jobs.end(first)
    assert jobs.claim() == second
    jobs.end(three)
    assert jobs.claim() == two


def _gang(jobs: Jobs, owner: Owner, leader: str) -> str:
    """A 2-node job whose leader (``leader``) claimed it and waits for its second node."""
    job_id = jobs.queue(owner, processes=2, nodes=2)
    claimed = scheduling.claim_next(jobs.session, CPU, f"{leader}-process", 60, node_id=leader)
    assert claimed is not None and claimed.job_id == job_id
    _add_node(jobs.session, job_id, 0, leader)
    return job_id


def _add_node(session: Session, job_id: str, rank: int, worker: str) -> None:
    node = {"process": f"{worker}-process", "host": "h"}
    session.execute(
        add_node("postgresql", job_id=job_id, attempt=1, node_rank=rank, worker_id=worker, **node)
    )


def test_gangs_fill_oldest_first_and_no_second_gang_starts_meanwhile(session: Session) -> None:
    jobs = Jobs(session)
    owner = jobs.owner("gangs")
    older = _gang(jobs, owner, "x")
    # A worker that could lead the next queued gang joins the assembling one instead.
    newer = jobs.queue(owner, processes=2, nodes=2)
    assert scheduling.claim_next(session, CPU, "y-process", 60, node_id="y") is None
    assert scheduling.oldest_open_gang(session, CPU, "y") == (older, 1, 2)
    assert scheduling.oldest_open_gang(session, CPU, "x") is None, "x holds node 0 of it"
    assert scheduling.oldest_open_gang(session, Capacity("cpu", 0), "y") is None, "too small"
    _add_node(session, older, 1, "y")
    assert scheduling.oldest_open_gang(session, CPU, "z") is None, "the gang is full"
    # Once no gang assembles, the next gang may be led.
    claimed = scheduling.claim_next(session, CPU, "z-process", 60, node_id="z")
    assert claimed is not None and (claimed.job_id, claimed.nodes) == (newer, 2)


def test_a_message_s_job_that_fits_is_not_starved_by_many_that_do_not(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scheduling, "CANDIDATES", 2)
    jobs = Jobs(session)
    owner = jobs.owner("mixed")
    for _ in range(3):
        jobs.queue(owner, "high", processes=16)  # too large for this worker, ahead in line
    small = jobs.queue(owner)
    assert jobs.claim() is None, "the first CANDIDATES jobs do not fit"
    claimed = scheduling.claim_next(session, CPU, "w", 60, message_job_id=small)
    assert claimed is not None and claimed.job_id == small


@pytest.fixture()
def own_database_url() -> Iterator[str]:
    """A database of the test's own: jobs committed to the session's would be claimed by the
    stack's worker (a claim takes the queue's best job, not only its message's)."""
    with fresh_database() as url:
        yield url


def test_concurrent_claims_of_one_owner_keep_its_quota(own_database_url: str) -> None:
    """Two workers claim at once: the second waits for the first's claim of the owner's job
    (the owner's row lock), then finds the owner at its quota and leaves the second job queued."""
    engine = make_sync_engine(own_database_url)
    sessions = sync_session_factory(engine)
    with sessions() as setup:
        jobs = Jobs(setup)
        owner = jobs.owner("racing", max_running_jobs=1)
        ids = [jobs.queue(owner, "high"), jobs.queue(owner, "high")]
        setup.commit()
        owner_id = owner.id
    try:
        with sessions() as first, sessions() as second:
            claimed = scheduling.claim_next(first, CPU, "w1", 60)
            assert claimed is not None and claimed.job_id == ids[0]
            results: list[Any] = []
            racer = threading.Thread(
                target=lambda: results.append(scheduling.claim_next(second, CPU, "w2", 60))
            )
            racer.start()
            racer.join(1.0)
            assert racer.is_alive(), "the second claim waits for the owner's row"
            first.commit()
            racer.join(30)
            assert not racer.is_alive()
            assert results[0] is None or results[0].job_id not in ids
            second.rollback()
        with sessions() as check:
            states = [check.get(Job, job_id).state for job_id in ids]  # type: ignore[union-attr]
            assert states == [JobState.STARTING, JobState.QUEUED]
    finally:
        with sessions() as cleanup:
            cleanup.execute(delete(Owner).where(Owner.id == owner_id))
            cleanup.commit()
        engine.dispose()
