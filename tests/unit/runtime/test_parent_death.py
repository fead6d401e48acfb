"""A training process dies with its parent: no orphaned torchrun or rank when a worker is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux"
)

# A parent that starts one child, prints the child's pid, then waits to be killed.
PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, *sys.argv[1:]] if sys.argv[1] != "--wrap" else
                         [sys.executable, "-m", "ace3.runtime.process.parent_death", str(os.getpid()),
                          "sleep", "120"])
print(child.pid, flush=True)
time.sleep(120)
"""
RANK = (
    "-c",
    "from ace3.runtime.process.parent_death import exit_with_parent; import time; exit_with_parent();"
    " print('armed', flush=True); time.sleep(120)",
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _child_dies_with_parent(args: list[str]) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, *args], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    if args != ["--wrap"]:  # the rank says when its parent-death signal is armed
        assert parent.stdout.readline().strip() == "armed"
    time.sleep(0.5)
    assert _alive(child)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its parent")


def test_a_wrapped_command_is_killed_when_its_supervisor_dies() -> None:
    _child_dies_with_parent(["--wrap"])


def test_a_rank_exits_when_its_torchrun_agent_dies() -> None:
    _child_dies_with_parent(list(RANK))


def test_the_wrapper_refuses_to_start_if_its_parent_already_changed() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ace3.runtime.process.parent_death", "1", "true"],
        capture_output=True,
    )
    assert result.returncode == 137


def test_the_worker_starts_it_by_its_path_without_the_sdk_package() -> None:
    """The prefix the worker puts before torchrun (uid and none sandboxes) runs the module by
    its path, importing nothing of the SDK, and becomes the command (exec: the same PID)."""
    from ace3_worker.sandbox.launch import _parent_death_prefix

    prefix = _parent_death_prefix()
    assert prefix[2] == str(os.getpid())
    load = f"import runpy, sys; runpy.run_path({prefix[1]!r}, run_name='x')"
    probe = subprocess.run(
        [sys.executable, "-c", f"{load}; print('ace3' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "False", probe.stderr
    child = subprocess.run(
        [*prefix, sys.executable, "-c", "import os; print(os.getppid())"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == str(os.getpid())
