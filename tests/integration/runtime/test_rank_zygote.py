"""A warm launcher's ranks are forks of its zygote (:mod:`ace3.runtime.process.rank_zygote`), a
process that runs one thread, never of torchrun's agent, which runs its store's threads when
it forks (the cause of a rank that hung now and then in ``TCPStore``'s constructor); and
nothing outlives the launcher."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ace3.config.warm_launch import WarmJob, parse_started, read_line, send_message
from ace3.runtime.process import rank_zygote
from ace3.runtime.process.warm_launcher import COMMAND, WARM_RANK_ARGS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm launchers: Linux"),
]

PROBE = """
import json, os, sys, time
parent = os.getppid()
print(json.dumps({
    "rank": int(os.environ["RANK"]),
    "pid": os.getpid(),
    "parent": parent,
    "parent_threads": len(os.listdir(f"/proc/{parent}/task")),
    "parent_name": open(f"/proc/{parent}/comm").read().strip(),
    "job_variable": os.environ.get("ACE3_TEST_JOB_ONLY"),
    "launcher_variable": os.environ.get("ACE3_TEST_LAUNCHER_ONLY"),
}), flush=True)
time.sleep(600)
"""


def _signal_mask(pid: int, field: str) -> int:
    """A /proc/<pid>/status signal mask (SigIgn: the signals the process ignores)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


def test_ranks_are_forks_of_a_one_thread_zygote_and_die_with_the_launcher(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    ours, theirs = socket.socketpair()
    with theirs:
        launcher = subprocess.Popen(
            [*COMMAND, "--control-fd", str(theirs.fileno())],
            env={**base, "ACE3_TEST_LAUNCHER_ONLY": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
            cwd=tmp_path,
        )
    ranks: list[dict[str, Any]] = []
    try:
        parse_started(read_line(ours))
        argv = ["--standalone", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=0",
                "--monitor-interval=0.05", *WARM_RANK_ARGS[:2], str(probe)]  # fmt: skip
        send_message(ours, WarmJob(argv=argv, env={**base, "ACE3_TEST_JOB_ONLY": "1"}))
        assert launcher.stdout is not None
        for line in launcher.stdout:  # (each rank prints one line, then sleeps)
            if line.startswith("{"):
                ranks.append(json.loads(line))
            if len(ranks) == 2:
                break
        assert sorted(rank["rank"] for rank in ranks) == [0, 1]
        for rank in ranks:
            assert rank["parent"] != launcher.pid, "a rank forked from the agent itself"
            assert rank["parent_name"] == "ace3-zygote"
            assert rank["parent_threads"] == 1, rank
            assert rank["job_variable"] == "1" and rank["launcher_variable"] is None
        zygote = ranks[0]["parent"]
        assert ranks[1]["parent"] == zygote
        # A SIGTERM to the group must not end the zygote (its ranks would die unsaved).
        ignored = _signal_mask(zygote, "SigIgn")
        assert all(ignored & (1 << (number - 1)) for number in (signal.SIGTERM, signal.SIGHUP))
        # (the engine's ranks put the defaults back: forked_rank._new_interpreter_signals)

        os.kill(launcher.pid, signal.SIGKILL)  # (the agent dies: nothing may stay behind)
        launcher.wait(timeout=30)
        deadline = time.monotonic() + 30
        survivors = [zygote, *(rank["pid"] for rank in ranks)]
        while survivors and time.monotonic() < deadline:
            survivors = [pid for pid in survivors if _alive(pid)]
            if survivors:
                time.sleep(0.05)
        assert not survivors, f"outlived the launcher: {survivors}"
    finally:
        ours.close()
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.communicate(timeout=30)


def test_a_thread_started_after_the_imports_refuses_the_zygote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """multiprocessing then starts its own forkserver, which imports the engine first."""
    preloads: list[list[str]] = []
    monkeypatch.setattr(rank_zygote.forkserver, "set_forkserver_preload", preloads.append)
    monkeypatch.setattr(rank_zygote.os, "fork", lambda: pytest.fail("forked"))
    why = rank_zygote.start(["torch"], rank_zygote.threads() - 1)
    assert why is not None and "threads" in why
    assert preloads == [["torch"]]
