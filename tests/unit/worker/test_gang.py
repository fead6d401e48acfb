"""Gang scheduling of multi-node jobs against a real database (SQLite) and the embedded broker:
workers take node slots (one per worker) through the supervisor's claim (the oldest gang still
assembling first, else the fair order), the leader launches only a full gang, and a gang that
never completes fails the job with a clear message, never starting part of it."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from ace3.runtime.process import torchrun as worker_torchrun
from ace3_control import job_transitions
from ace3_control.job_nodes import drop_silent_waiting, members
from ace3_control.models import Job, JobNode, utcnow
from ace3_control.settings import Settings
from ace3_server.migrations_check import upgrade
from ace3_worker.device import local_capacity
from ace3_worker.gang import NodeSeat, rendezvous_endpoint
from ace3_worker.supervisor import Supervisor
from tests.conftest import insert_job

TORCHRUN_SCRIPT = os.path.abspath(worker_torchrun.__file__)


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    settings = Settings(
        data_dir=tmp_path,
        queue_name="gang-test",
        worker_device="cpu",
        worker_cpu_processes=2,
        worker_advertise_host="127.0.0.1",
        gang_wait_seconds=30,
        heartbeat_seconds=0.2,
        lease_seconds=5,
        unfit_republish_seconds=30,
    )
    upgrade(settings.resolved_database_url)
    return settings


def _worker(settings: Settings, name: str) -> Supervisor:
    return Supervisor(settings, node_id=f"worker-{name}")


def _take(worker: Supervisor, job_id: str) -> NodeSeat | None:
    """What the worker's claim for a message of ``job_id`` gives it (the path every message
    takes, ``Supervisor._claim_next``): a gang's seat, or None."""
    claim = worker._claim_next(job_id, local_capacity(worker.settings))
    assert claim is None or isinstance(claim, NodeSeat)
    return claim


def _job(settings: Settings, nodes: int) -> str:
    sessions = Supervisor(settings).sessions
    with sessions() as session:
        job = insert_job(session, num_processes=nodes, config={"num_gpus": 1, "num_nodes": nodes})
        return str(job.id)


def _job_row(settings: Settings, job_id: str) -> Job:
    with Supervisor(settings).sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def _nodes(settings: Settings, job_id: str, attempt: int = 1) -> list[JobNode]:
    with Supervisor(settings).sessions() as session:
        return list(session.scalars(members(job_id, attempt)))


def _messages(settings: Settings) -> list[dict[str, Any]]:
    folder = settings.broker_dir / "out"
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*"))]


def test_each_worker_takes_one_slot_and_spare_copies_do_nothing(settings: Settings) -> None:
    job_id = _job(settings, 3)
    first, second, third, fourth = (_worker(settings, name) for name in "abcd")

    lead = _take(first, job_id)
    assert lead is not None and (lead.node_rank, lead.attempt, lead.is_leader) == (0, 1, True)
    assert _job_row(settings, job_id).state == "starting"
    published = _messages(settings)
    assert len(published) == 2, "one message per missing node"
    assert all(job_id in message["headers"]["argsrepr"] for message in published)

    joined = _take(second, job_id)
    assert joined is not None and joined.node_rank == 1 and not joined.is_leader
    # The same worker (another of its slots) never holds a second node: the copy does nothing
    # (the leader publishes again for the slots still missing).
    assert _take(Supervisor(settings, node_id="worker-b"), job_id) is None
    assert len(_messages(settings)) == 2

    third_seat = _take(third, job_id)
    assert third_seat is not None and third_seat.node_rank == 2
    assert _take(fourth, job_id) is None, "every slot is taken"
    rows = _nodes(settings, job_id)
    assert [(row.node_rank, row.worker_id, row.state) for row in rows] == [
        (0, "worker-a", "waiting"),
        (1, "worker-b", "waiting"),
        (2, "worker-c", "waiting"),
    ]


def test_gangs_fill_one_at_a_time_in_the_fair_order(settings: Settings) -> None:
    """Whichever job's message a worker gets, it joins the oldest gang still assembling, and
    leads the fair order's next gang only when no gang it could join is open."""
    older, newer = _job(settings, 2), _job(settings, 2)
    seat = _take(_worker(settings, "a"), newer)
    assert seat is not None and (seat.job_id, seat.node_rank) == (older, 0), "the older first"
    seat = _take(_worker(settings, "b"), newer)
    assert seat is not None and (seat.job_id, seat.node_rank) == (older, 1), "completes it"
    seat = _take(_worker(settings, "c"), older)
    assert seat is not None and (seat.job_id, seat.node_rank) == (newer, 0), "then the next"
    seat = _take(_worker(settings, "d"), older)
    assert seat is not None and (seat.job_id, seat.node_rank) == (newer, 1)


def test_a_full_gang_gets_one_endpoint_and_the_job_runs(settings: Settings) -> None:
    job_id = _job(settings, 2)
    leader, follower = _worker(settings, "a"), _worker(settings, "b")
    lead = _take(leader, job_id)
    assert lead is not None
    results: dict[str, bool] = {}
    thread = threading.Thread(target=lambda: results.update(lead=leader.gang.assemble(lead)))
    thread.start()
    time.sleep(0.3)
    assert _job_row(settings, job_id).state == "starting", "no go before the gang is complete"
    seat = _take(follower, job_id)
    assert seat is not None
    assert follower.gang.assemble(seat) is True
    thread.join(timeout=10)
    assert results == {"lead": True}
    assert lead.endpoint == seat.endpoint
    assert seat.endpoint is not None and seat.endpoint.startswith("127.0.0.1:")
    assert _job_row(settings, job_id).state == "running"
    assert [row.state for row in _nodes(settings, job_id)] == ["running", "running"]


def test_a_gang_that_never_completes_fails_the_job_clearly(settings: Settings) -> None:
    settings = settings.model_copy(update={"gang_wait_seconds": 1.0})
    job_id = _job(settings, 2)
    started = time.monotonic()
    Supervisor(settings, node_id="worker-a").run(job_id)
    assert time.monotonic() - started < 5
    job = _job_row(settings, job_id)
    assert job.state == "failed" and job.started_at is None, "torchrun never started"
    assert job.error is not None
    assert job.error.startswith("needed 2 workers for num_nodes=2, only 1 came within 1 s")
    assert [row.state for row in _nodes(settings, job_id)] == ["left"]
    # A worker that comes later finds nothing to join.
    assert _take(_worker(settings, "b"), job_id) is None


def test_a_waiting_follower_leaves_when_the_job_is_cancelled(settings: Settings) -> None:
    job_id = _job(settings, 3)
    leader, follower = _worker(settings, "a"), _worker(settings, "b")
    lead = _take(leader, job_id)
    seat = _take(follower, job_id)
    assert lead is not None and seat is not None
    with Supervisor(settings).sessions() as session:
        session.execute(job_transitions.request_cancel(job_id))
        session.commit()
    assert follower.gang.assemble(seat) is False
    assert leader.gang.assemble(lead) is False
    job = _job_row(settings, job_id)
    assert job.state == "cancelled" and "waiting for the workers" in (job.error or "")
    assert [row.state for row in _nodes(settings, job_id)] == ["left", "left"]


def test_a_silent_waiting_follower_frees_its_slot(settings: Settings) -> None:
    job_id = _job(settings, 2)
    lead = _take(_worker(settings, "a"), job_id)
    seat = _take(_worker(settings, "b"), job_id)
    assert lead is not None and seat is not None
    sessions = Supervisor(settings).sessions
    with sessions() as session:
        session.execute(
            update(JobNode)
            .where(JobNode.node_rank == 1)
            .values(heartbeat_at=utcnow() - timedelta(seconds=60))
        )
        session.execute(drop_silent_waiting(job_id, 1, utcnow() - timedelta(seconds=5)))
        session.commit()
        assert list(session.scalars(select(JobNode.node_rank))) == [0]
    replacement = _take(_worker(settings, "c"), job_id)
    assert replacement is not None and replacement.node_rank == 1
    # The dropped worker notices at its next heartbeat and leaves.
    dropped = _worker(settings, "b").gang
    assert dropped.assemble(NodeSeat(job_id, 1, 1, 2)) is False


def test_the_rendezvous_endpoint_brackets_an_ipv6_host() -> None:
    assert rendezvous_endpoint("10.0.0.5", 29400) == "10.0.0.5:29400"
    assert rendezvous_endpoint("node-a.cluster", 29400) == "node-a.cluster:29400"
    assert rendezvous_endpoint("fd00::5", 29400) == "[fd00::5]:29400"


def test_every_node_launches_torchrun_against_the_leader_s_c10d_rendezvous(
    tmp_path: Path,
) -> None:
    from ace3_worker.launcher import multinode_torchrun_command

    def command(is_host: bool) -> list[str]:
        return multinode_torchrun_command(
            "/job/job.json",
            4,
            nnodes=2,
            endpoint="10.0.0.5:29400",
            rendezvous_id="job-3",
            is_host=is_host,
            local_addr="10.0.0.6",
            join_timeout=300,
        )

    leader, follower = command(True), command(False)
    run = leader.index(str(TORCHRUN_SCRIPT))  # (ace3.runtime.process.torchrun, by its path)
    assert leader[run + 1 : run + 12] == [
        "--nnodes=2",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.5:29400",
        "--rdzv-id=job-3",
        "--rdzv-conf=is_host=true,join_timeout=300",
        "--local-addr=10.0.0.6",
        "--max-restarts=0",
        "--monitor-interval=0.02",
        "--shutdown-timeout=30",  # (the worker passes its longest grace)
        "-m",
    ]
    assert "--rdzv-conf=is_host=false,join_timeout=300" in follower
    assert leader[-3:] == ["ace3.runtime", "--job", "/job/job.json"]
    assert not any(arg.startswith(("--standalone", "--node-rank")) for arg in leader)


def test_a_node_whose_ranks_died_of_a_cancel_reports_it_was_stopped(
    settings: Settings, tmp_path: Path
) -> None:
    """A cancel stops one node; the other node's ranks may die of the broken connection before
    its heartbeat saw the flag. Its exit reads the flag once more: stopped, not failed."""
    from ace3_worker import reports
    from ace3_worker.gang_node import GangNode
    from ace3_worker.watch import AttemptWatch

    job_id = _job(settings, 2)
    leader, follower = _worker(settings, "a"), _worker(settings, "b")
    lead = _take(leader, job_id)
    thread = threading.Thread(target=lambda: leader.gang.assemble(lead))  # type: ignore[arg-type]
    thread.start()
    seat = _take(follower, job_id)
    assert lead is not None and seat is not None and follower.gang.assemble(seat)
    thread.join(timeout=10)
    node = GangNode(follower.gang, seat, leader.outcomes)
    events = reports.EventTail(tmp_path)

    # Failing on its own (no cancel): reported as a failure of this node.
    watch = AttemptWatch(job_id, seat.attempt)
    watch.output.rank_stderr_tail.append((1, "RuntimeError: Connection closed by peer"))
    node.report(_job_row(settings, job_id), watch, 1, events, lambda: None)
    (_, mine) = _nodes(settings, job_id)
    assert mine.exit_code == 1 and mine.stopped is None

    with Supervisor(settings).sessions() as session:
        session.execute(job_transitions.request_cancel(job_id))
        session.commit()
    watch = AttemptWatch(job_id, seat.attempt)
    node.report(_job_row(settings, job_id), watch, 1, events, lambda: None)
    (_, mine) = _nodes(settings, job_id)
    assert mine.stopped == "the job was cancelled"


def test_a_message_whose_job_waits_behind_another_is_sent_again(settings: Settings) -> None:
    """A worker given job X's message takes Y, first in the fair order: X, still queued, gets a
    message again at once (Y's own message may reach a worker where nothing fits, which drops
    it); a message whose own job is taken sends nothing."""
    from ace3_control.capacity import Capacity

    sessions = Supervisor(settings).sessions
    with sessions() as session:
        first = str(insert_job(session, priority="high").id)
        waiting = str(insert_job(session).id)
    supervisor = Supervisor(settings, node_id="worker-a")
    cpu = Capacity("cpu", 2)
    before = len(_messages(settings))
    taken = supervisor._claim_next(waiting, cpu)
    assert taken is not None and taken.job_id == first
    assert [m for m in _messages(settings)[before:] if waiting in json.dumps(m)], "sent again"
    before = len(_messages(settings))
    taken = supervisor._claim_next(waiting, cpu)
    assert taken is not None and taken.job_id == waiting
    assert len(_messages(settings)) == before, "its own job taken: nothing sent"
