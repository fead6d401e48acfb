"""The failure's headline is its root cause: the ranks' own ``rank_failure`` records (written
with a nanosecond time by each rank that raised) name the earliest failure, and the later
ones follow as its consequences; without a record, the rank that wrote to stderr last.
Also: the worker's own notices about a job go to the ``service`` stream."""

from __future__ import annotations

import json
import queue
from pathlib import Path
from typing import Any

from ace3.config.events import RankFailureRecord, RefusedRecord, parse_record
from ace3.runtime.observe.reporting import report_rank_failure
from ace3_worker import reports
from ace3_worker.attempt import MAX_RANK_FAILURES_PER_ATTEMPT
from ace3_worker.failures import RankFailure, failure_message
from ace3_worker.ingest import SERVICE_STREAM, Ingest, JobOutput

PEER_ERROR = (
    "torch.distributed.DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534]"
    " Connection closed by peer [127.0.0.1]:12345 ... GLHF!"
)
# Rank 0 raised first; rank 1, waiting in the all-reduce, failed on the closed connection and
# wrote to stderr last.
STDERR = [
    (0, "Traceback (most recent call last):"),
    (0, '  File "model.py", line 3, in forward'),
    (0, "ValueError: bad shape (3, 4)"),
    (1, "Traceback (most recent call last):"),
    (1, PEER_ERROR),
]
ROOT = RankFailureRecord(
    rank=0, error_type="ValueError", message="bad shape (3, 4)", time_ns=1_000_000_000
)
PEER = RankFailureRecord(
    rank=1,
    error_type="torch.distributed.DistBackendError",
    message=PEER_ERROR.partition(": ")[2],
    time_ns=1_012_000_000,
)


def test_the_earliest_failure_record_is_the_headline_and_the_peers_follow() -> None:
    message = failure_message(1, STDERR, [], RankFailure(1, 1), None, [PEER, ROOT])
    lines = message.splitlines()
    assert lines[0] == "training exited with code 1: rank 0: ValueError: bad shape (3, 4)"
    assert lines[1].startswith("then rank 1, 0.012 s later: torch.distributed.DistBackendError")
    assert lines[2:] == [line for rank, line in STDERR if rank == 0], "the cause's own stderr"


def test_without_a_record_the_last_rank_on_stderr_is_named_as_before() -> None:
    message = failure_message(1, STDERR, [], RankFailure(1, 1))
    assert message.splitlines()[0] == f"training exited with code 1: rank 1: {PEER_ERROR}"


def test_a_rank_killed_by_a_signal_stays_the_headline() -> None:
    killed = RankFailure(1, -9)
    message = failure_message(1, [(1, "step 3")], [], killed, None, [ROOT])
    assert message.splitlines()[0] == "training failed: rank 1 killed by SIGKILL (out of memory?)"


def test_many_records_are_summarised() -> None:
    records = [
        RankFailureRecord(rank=rank, error_type="RuntimeError", message="x", time_ns=rank)
        for rank in range(20)
    ]
    lines = failure_message(1, [], [], None, None, records).splitlines()
    assert lines[0].endswith("rank 0: RuntimeError: x")
    assert lines[9] == "(and 11 more failures)"


def test_the_engine_writes_a_record_the_worker_accepts(tmp_path: Path) -> None:
    error = ValueError("line one\nline two\x1b[31m" + "x" * 5000)
    report_rank_failure(tmp_path, 3, error, 1234)
    report_rank_failure(tmp_path, 0, KeyError("k"), 1200)
    lines = (tmp_path / "events.jsonl").read_bytes().splitlines()
    first, second = (parse_record(line) for line in lines)
    assert isinstance(first, RankFailureRecord) and isinstance(second, RankFailureRecord)
    assert (first.rank, first.error_type, first.time_ns) == (3, "ValueError", 1234)
    assert first.message.startswith("line one line two [31mxxx") and len(first.message) == 1000
    assert (second.error_type, second.message) == ("KeyError", "'k'")


def test_the_worker_refuses_bad_records() -> None:
    good: dict[str, Any] = {
        "type": "rank_failure",
        "rank": 0,
        "error_type": "ValueError",
        "message": "m",
        "time_ns": 5,
    }
    assert isinstance(parse_record(json.dumps(good).encode()), RankFailureRecord)
    for bad in (
        {"message": "two\nlines"},
        {"message": "x" * 1001},
        {"error_type": "not a name"},
        {"rank": -1},
        {"time_ns": 1 << 64},
        {"time_ns": "5"},
        {"extra": 1},
    ):
        assert isinstance(parse_record(json.dumps(good | bad).encode()), RefusedRecord), bad


def test_the_worker_keeps_the_earliest_records_within_its_bound() -> None:
    ingest = Ingest(None, None, None)  # type: ignore[arg-type]
    output = JobOutput()
    events = reports.EventTail(Path("/nonexistent"))
    total = MAX_RANK_FAILURES_PER_ATTEMPT + 10
    for number in reversed(range(total)):
        record = RankFailureRecord(rank=0, error_type="E", message="", time_ns=number)
        item = ingest._take(output, None, None, events, record)  # type: ignore[arg-type]
        assert item.notice is None and not item.typed
    assert [record.time_ns for record in output.rank_failures] == list(
        range(MAX_RANK_FAILURES_PER_ATTEMPT)
    )


class _Artifacts:
    job_id = "job"

    def sync(self, sessions: object) -> None:
        pass

    def take_notices(self) -> list[str]:
        return ["ace3: artifact big.bin not synced: 2 GiB is over ACE3_MAX_ARTIFACT_BYTES"]


def test_the_artifact_cap_notice_is_a_service_line() -> None:
    lines: queue.Queue[reports.LogLine] = queue.Queue()
    Ingest(None, None, None).sync_artifacts(_Artifacts(), lines)  # type: ignore[arg-type]
    line = lines.get_nowait()
    assert (line.stream, line.rank) == (SERVICE_STREAM, None)
    assert "ACE3_MAX_ARTIFACT_BYTES" in line.line
