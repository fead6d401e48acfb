"""The worker's torchrun (``ace3.runtime.process.torchrun``, started by its path) ends as torchrun does:
the same exit status (a successful run: every job of the stack tests) and, when a rank fails,
the same error summary on stderr (the worker reads the failed rank's exit code from it:
``ace3_worker.failures``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ace3.runtime.process import torchrun as worker_torchrun
from ace3.runtime.process.torchrun import COMMAND, _exit_status

RANK = "import sys; print('rank ran', flush=True); sys.exit(int(sys.argv[1]))\n"


def _run(tmp_path: Path, rank_exit: int) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    arguments = ["--standalone", "--nnodes=1", "--nproc-per-node=1", "--max-restarts=0"]
    return subprocess.run(
        [*COMMAND, *arguments, str(script), str(rank_exit)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def test_started_by_its_path_without_the_sdk_package() -> None:
    assert [sys.executable, str(Path(worker_torchrun.__file__).absolute())] == COMMAND
    # (its module body, run as the worker runs it, imports nothing of the SDK)
    load = f"import runpy, sys; runpy.run_path({COMMAND[1]!r}, run_name='x')"
    probe = subprocess.run(
        [sys.executable, "-c", f"{load}; print('ace3' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "False", probe.stderr


def test_a_failed_rank_exits_1_with_torchruns_error_summary(tmp_path: Path) -> None:
    result = _run(tmp_path, 3)
    assert result.returncode == 1
    assert "rank ran" in result.stdout
    assert "ChildFailedError" in result.stderr  # (the traceback, as the interpreter prints it)
    assert "Root Cause (first observed failure)" in result.stderr
    assert "exitcode  : 3" in result.stderr


def test_system_exit_keeps_the_interpreters_exit_status(capsys) -> None:
    assert _exit_status(SystemExit(None)) == 0
    assert _exit_status(SystemExit(4)) == 4
    assert _exit_status(SystemExit("bad arguments")) == 1
    assert "bad arguments" in capsys.readouterr().err


def test_a_single_node_skips_the_rendezvous_first_round_skew(monkeypatch) -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    slept: list[float] = []
    monkeypatch.setattr(dynamic_rendezvous, "_delay", slept.append)
    worker_torchrun._no_first_round_skew()
    dynamic_rendezvous._delay((0, 0.3))  # the first round's random skew: skipped
    dynamic_rendezvous._delay(1)  # a wait for other nodes: kept
    assert slept == [1]
