"""A single-node attempt's keep-alive (while its directory and environment are prepared, before
the watch loop runs): it renews the lease, and a heartbeat that finds the job cancelled, or the
attempt no longer the job's, sets the interrupt that stops an environment's build."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ace3_control.settings import Settings
from ace3_worker.attempt import Beat
from ace3_worker.membership import SingleNode


def _node(tmp_path: Any, beats: list[Beat]) -> tuple[SingleNode, list[Beat]]:
    settings = Settings(data_dir=tmp_path, heartbeat_seconds=0.02)
    node = SingleNode("job", 1, settings, sessions=None, outcomes=None, watcher=None)  # type: ignore[arg-type]
    given: list[Beat] = []

    def beat() -> Beat:
        answer = beats[min(len(given), len(beats) - 1)]
        given.append(answer)
        return answer

    node.beat = beat  # type: ignore[method-assign]
    return node, given


@pytest.mark.parametrize(
    "then", [Beat(owned=True, cancel_requested=True), Beat(owned=False, cancel_requested=False)]
)
def test_a_cancel_or_a_lost_lease_interrupts_the_preparation(tmp_path: Any, then: Beat) -> None:
    node, given = _node(tmp_path, [Beat(owned=True, cancel_requested=False)] * 3 + [then])
    interrupt = threading.Event()
    with node.keep_alive(interrupt):
        assert interrupt.wait(5), "the keep-alive did not set the interrupt"
    assert len(given) >= 4


def test_the_lease_is_renewed_and_nothing_interrupted_while_the_job_is_wanted(
    tmp_path: Any,
) -> None:
    node, given = _node(tmp_path, [Beat(owned=True, cancel_requested=False)])
    interrupt = threading.Event()
    with node.keep_alive(interrupt):
        while len(given) < 5:
            assert not interrupt.wait(0.02)
    assert not interrupt.is_set()
