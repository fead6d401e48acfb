"""Log lines keep their rank, the events tail reads only whole lines, ranks get no credentials."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ace3.config.events import StartRecord
from ace3.runtime.process import torchrun as worker_torchrun
from ace3_worker.failures import failure_message
from ace3_worker.launcher import rank_environment, torchrun_command
from ace3_worker.reports import EventTail, parse_log_line

TORCHRUN_SCRIPT = os.path.abspath(worker_torchrun.__file__)


def test_rank_prefix_is_parsed_and_stripped() -> None:
    line = parse_log_line("stdout", "[rank 1] ready: world_size=2\n")
    assert (line.rank, line.line, line.stream) == (1, "ready: world_size=2", "stdout")
    other = parse_log_line("stderr", "torchrun warning\n")
    assert (other.rank, other.line) == (None, "torchrun warning")


def test_event_tail_reads_only_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventTail(tmp_path)
    assert tail.read_new() == []
    with path.open("w") as handle:
        handle.write(json.dumps({"type": "start", "total_steps": 9}) + "\n" + '{"type": "sta')
    assert tail.read_new() == [StartRecord(type="start", total_steps=9)]
    with path.open("a") as handle:
        handle.write('rt", "total_steps": 5}\n')
    assert tail.read_new() == [StartRecord(type="start", total_steps=5)]
    assert tail.read_new() == []
    assert tail.plan == StartRecord(type="start", total_steps=5), "the smallest plan holds"


def test_ranks_get_no_service_credentials() -> None:
    base = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "ACE3_DATABASE_URL": "postgresql://secret@db/ace3",
        "ACE3_BROKER_URL": "redis://secret@redis/0",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "NCCL_DEBUG": "INFO",
    }
    env = rank_environment("cpu", 2, base=base)
    assert "ACE3_DATABASE_URL" not in env and "ACE3_BROKER_URL" not in env
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["NCCL_DEBUG"] == "INFO" and env["PATH"] == "/usr/bin"
    assert env["ACE3_DEVICE"] == "cpu" and int(env["OMP_NUM_THREADS"]) >= 1


def test_cpu_threads_are_shared_by_every_rank_of_every_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert rank_environment("cpu", 2, worker_slots=1, base={})["OMP_NUM_THREADS"] == "8"
    assert rank_environment("cpu", 2, worker_slots=4, base={})["OMP_NUM_THREADS"] == "2"
    assert rank_environment("cpu", 8, worker_slots=4, base={})["OMP_NUM_THREADS"] == "1"
    assert (
        rank_environment("cpu", 2, worker_slots=4, base={"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"]
        == "3"
    )


def test_torchrun_command_runs_one_process_per_gpu() -> None:
    command = torchrun_command("/job/job.json", 4)
    # (the worker's torchrun, started by its path: ace3.runtime.process.torchrun)
    assert command[:3] == [sys.executable, str(TORCHRUN_SCRIPT), "--standalone"]
    assert "--nproc-per-node=4" in command and "--max-restarts=0" in command
    assert command[-3:] == ["ace3.runtime", "--job", "/job/job.json"]


def test_a_failure_names_the_ranks_exception_not_torchruns_summary() -> None:
    rank_stderr: list[tuple[int, str]] = []
    for rank in (0, 1):
        rank_stderr.extend(
            [
                (rank, "Traceback (most recent call last):"),
                (rank, '  File "model.py", line 2'),
                (rank, "ValueError: boom"),
            ]
        )
    launcher = ["torch.distributed.elastic...ChildFailedError:", "=" * 60]
    message = failure_message(1, rank_stderr, launcher)
    assert message.splitlines()[0] == "training exited with code 1: rank 1: ValueError: boom"
    assert "Traceback" in message and "ChildFailedError" not in message

    assert (
        failure_message(2, [], ["torchrun: error: bad arguments"])
        == "training exited with code 2\ntorchrun: error: bad arguments"
    )


def test_out_of_memory_halvings_are_bounded_by_the_per_rank_micro_batch() -> None:
    """Exit status 75 is the job's own claim: it buys at most log2(per-rank micro-batch)
    attempts, and none where the engine never halves (a pipeline, dynamic_batch_size off)."""
    from ace3_worker.outcome import max_micro_batch_halvings

    assert max_micro_batch_halvings({"batch_size": 64, "num_gpus": 2}, 2) == 5  # 32 per rank
    assert max_micro_batch_halvings({"batch_size": 64, "num_gpus": 2}, 64) == 0
    assert max_micro_batch_halvings({"batch_size": 1_000_000, "num_gpus": 8}, 8) == 16
    tensor = {"batch_size": 64, "num_gpus": 2, "parallelism": "model",
              "model_sharding_strategy": "tensor"}  # fmt: skip
    assert max_micro_batch_halvings(tensor, 2) == 6, "every rank runs the whole batch"
    data_x_tensor = {"batch_size": 64, "num_gpus": 4, "tensor_parallel_size": 2}
    assert max_micro_batch_halvings(data_x_tensor, 4) == 5, "2 replicas of 32 samples"
    assert max_micro_batch_halvings({"batch_size": 64, "dynamic_batch_size": False}, 1) == 0
    pipeline = {"batch_size": 64, "num_gpus": 2, "parallelism": "pipeline"}
    assert max_micro_batch_halvings(pipeline, 2) == 0
    assert max_micro_batch_halvings({"batch_size": "not a number"}, 1) == 0


def test_an_out_of_memory_exit_counts_even_when_a_peer_failed_first() -> None:
    """Rank 0, waiting in DDP's all-reduce, can fail on the closed connection before torchrun
    sees rank 1's exit status 75: torchrun then names rank 0 as the root cause."""
    from ace3.errors import OUT_OF_MEMORY_EXIT_CODE
    from ace3_worker.failures import failed_ranks
    from ace3_worker.outcome import ran_out_of_memory
    from ace3_worker.watch import AttemptWatch

    summary = [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================",
        "ace3.runtime FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "[1]:",
        "  time      : 2026-11-25_13:45:02",
        "  host      : localhost",
        "  rank      : 1 (local_rank: 1)",
        f"  exitcode  : {OUT_OF_MEMORY_EXIT_CODE} (pid: 4242)",
        "  error_file: <N/A>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-25_13:45:01",
        "  host      : localhost",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : 1 (pid: 4241)",
        "============================================================",
    ]
    assert [(f.rank, f.exit_code) for f in failed_ranks(summary)] == [
        (1, OUT_OF_MEMORY_EXIT_CODE),
        (0, 1),
    ]
    watch = AttemptWatch("job", 1)
    watch.output.launcher_stderr_tail.extend(summary)
    assert ran_out_of_memory(watch)
    watch.output.launcher_stderr_tail.clear()
    watch.output.launcher_stderr_tail.extend(line.replace(" 75 ", " 1 ") for line in summary)
    assert not ran_out_of_memory(watch)
    assert failed_ranks(["no summary"]) == []
