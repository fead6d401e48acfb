"""The decisions of a multi-node attempt: when a node must stop because of another, and how the
leader records the attempt from every node's report."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ace3_control.capacity import Capacity, JobNeeds, cluster_problem
from ace3_control.job_nodes import (
    NodeReport,
    attempt_verdict,
    gang_timeout_error,
    nodes_of,
    peer_trouble,
)
from ace3_control.models import NodeState, utcnow

NOW = utcnow()


def node(rank: int, state: str = NodeState.RUNNING, **fields: object) -> NodeReport:
    values: dict = {"heartbeat_at": NOW, "finished_at": None, **fields}
    return NodeReport(rank, f"w{rank}", f"host:{100 + rank}", state, **values)


def exited(rank: int, code: int, seconds: float = 0.0, **fields: object) -> NodeReport:
    return node(
        rank, NodeState.EXITED, exit_code=code, finished_at=NOW + timedelta(seconds=seconds),
        **fields,
    )  # fmt: skip


def test_nodes_of_a_stored_config() -> None:
    assert nodes_of({"num_nodes": 3}) == 3
    assert nodes_of({}) == 1 and nodes_of(None) == 1


def test_running_peers_and_a_peer_that_finished_cleanly_are_no_trouble() -> None:
    nodes = [node(0), exited(1, 0)]
    assert peer_trouble(nodes, 0, 2, NOW, lost_after=15) is None


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        ([node(0), exited(1, 1)], "node 1 (worker host:101) ended with exit code 1"),
        ([node(0), node(1, NodeState.LEFT)], "node 1 (worker host:101) left the attempt"),
        (
            [node(0), node(1, heartbeat_at=NOW - timedelta(seconds=20))],
            "node 1 (worker host:101) stopped heartbeating",
        ),
        ([node(0)], "node 1 is no longer part of the attempt"),
    ],
)
def test_a_failed_silent_or_missing_peer_stops_this_node(
    nodes: list[NodeReport], expected: str
) -> None:
    trouble = peer_trouble(nodes, 0, 2, NOW, lost_after=15)
    assert trouble is not None and expected in trouble


def test_this_node_s_own_row_is_never_its_trouble() -> None:
    assert peer_trouble([exited(0, 1), node(1)], 1, 2, NOW, lost_after=15) is not None
    assert peer_trouble([exited(0, 1), node(1)], 0, 2, NOW, lost_after=15) is None


def test_every_node_at_zero_succeeds_with_the_metrics_of_the_rank_0_node() -> None:
    verdict = attempt_verdict(
        [exited(0, 0), exited(1, 0, final_metrics={"val_accuracy": 0.93})],
        needed=2,
        attempt=1,
        cancel_requested=False,
    )
    assert verdict.outcome == "succeeded" and verdict.exit_code == 0
    assert verdict.final_metrics == {"val_accuracy": 0.93}


def test_the_node_that_failed_by_itself_is_the_error_not_the_ones_stopped_after_it() -> None:
    verdict = attempt_verdict(
        [
            exited(0, -15, 2, stopped="node 1 ended with exit code 1", error="SIGTERM"),
            exited(1, 1, 1, error="training exited with code 1: rank 1: ValueError: bad"),
        ],
        needed=2,
        attempt=1,
        cancel_requested=False,
    )
    assert verdict.outcome == "failed" and verdict.exit_code == 1
    assert verdict.error is not None
    assert verdict.error.startswith("node 1 (worker host:101): training exited with code 1")
    assert "ValueError: bad" in verdict.error


def test_of_two_nodes_failing_by_themselves_the_first_is_the_error() -> None:
    verdict = attempt_verdict(
        [exited(0, 1, 5, error="second"), exited(1, 1, 1, error="first")],
        needed=2,
        attempt=1,
        cancel_requested=False,
    )
    assert verdict.error is not None and verdict.error.endswith("first")


def test_a_node_that_never_reported_re_queues_the_attempt_whatever_the_others_say() -> None:
    verdict = attempt_verdict(
        [exited(0, 1, error="gloo: connection closed by peer"), node(1)],
        needed=2,
        attempt=3,
        cancel_requested=False,
    )
    assert verdict.outcome == "retry"
    assert verdict.error == "node 1 (worker host:101) stopped reporting during attempt 3"


def test_a_torchrun_killed_by_a_signal_nobody_sent_re_queues() -> None:
    verdict = attempt_verdict(
        [exited(0, -9), exited(1, -15, stopped="node 0 ended with exit code -9")],
        needed=2,
        attempt=1,
        cancel_requested=False,
    )
    assert verdict.outcome == "retry" and "killed by signal 9" in (verdict.error or "")


def test_nodes_stopped_only_by_the_service_re_queue() -> None:
    verdict = attempt_verdict(
        [exited(0, -15, stopped="node 1 stopped heartbeating"), exited(1, -15, stopped="lost")],
        needed=2,
        attempt=1,
        cancel_requested=False,
    )
    assert verdict.outcome == "retry" and "was stopped" in (verdict.error or "")


def test_a_cancel_wins() -> None:
    verdict = attempt_verdict(
        [exited(0, -15, stopped="cancelled"), exited(1, 1)],
        needed=2,
        attempt=1,
        cancel_requested=True,
    )
    assert verdict.outcome == "cancelled"


def test_the_gang_timeout_message_names_the_count_and_the_setting() -> None:
    message = gang_timeout_error(2, 1, 300)
    assert message.startswith("needed 2 workers for num_nodes=2, only 1 came within 300 s")
    assert "ACE3_GANG_WAIT_SECONDS" in message


def test_a_multi_node_job_needs_that_many_fitting_workers() -> None:
    workers = [Capacity("cpu", 8), Capacity("cpu", 1)]
    assert cluster_problem(JobNeeds(1, "auto", nodes=2), workers) is None
    problem = cluster_problem(JobNeeds(2, "auto", nodes=2), workers)
    assert problem is not None and problem.field == "num_nodes"
    assert "num_nodes=2 runs on 2 different workers with 2 processes each" in problem.message
    assert "only 1 live worker fits one node" in problem.message
    assert "use num_nodes <= 1" in problem.message
    three = cluster_problem(JobNeeds(1, "auto", nodes=3), workers)
    assert (
        three is not None and three.field == "num_nodes" and "only 2 live workers" in three.message
    )
    too_big = cluster_problem(JobNeeds(16, "auto", nodes=2), workers)
    assert too_big is not None and too_big.field == "num_gpus"


def test_job_needs_of_a_job_row_are_per_node() -> None:
    assert JobNeeds.from_job(6, {"num_gpus": 3, "num_nodes": 2}) == JobNeeds(3, "auto", 2)
    assert JobNeeds.from_job(2, {}) == JobNeeds(2, "auto", 1)


def test_a_node_that_only_saw_its_peer_die_is_not_the_root_cause() -> None:
    echo = "training exited with code 1: rank 0: RuntimeError: Connection closed by peer [::1]"
    verdict = attempt_verdict(
        [exited(0, 1, 1, error=echo), exited(1, 1, 2, error="rank 1: ValueError: boom")],
        needed=2,
        attempt=1,
        cancel_requested=False,
    )
    assert verdict.error is not None and verdict.error.endswith("ValueError: boom")


def test_multi_node_zero_sharding_is_refused_only_with_background_saves() -> None:
    import ace3
    from ace3.config import unsupported_settings

    assert unsupported_settings(ace3.TrainingConfig(num_nodes=2, zero_stage=2, batch_size=32)) == []
    [problem] = unsupported_settings(
        ace3.TrainingConfig(num_nodes=2, cpu_offload=True, async_save=True, batch_size=32)
    )
    assert problem.field == "async_save"
    assert "offload (which runs ZeRO-3)" in problem.reason and "async_save=False" in problem.reason


def test_a_node_whose_rank_ran_out_of_memory_in_a_step_halves_the_micro_batch() -> None:
    from ace3.errors import OUT_OF_MEMORY_EXIT_CODE

    verdict = attempt_verdict(
        [
            exited(0, 1, 2, error="rank 0: RuntimeError: Connection closed by peer"),
            exited(1, OUT_OF_MEMORY_EXIT_CODE, 1, error="StepOutOfMemoryError: out of memory"),
        ],
        needed=2,
        attempt=1,
        cancel_requested=False,
    )
    assert verdict.outcome == "out_of_memory" and verdict.exit_code == OUT_OF_MEMORY_EXIT_CODE
