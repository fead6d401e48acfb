"""The per-job limits while an attempt runs (ace3_worker.usage_monitor), on real processes
started the way the worker starts a job (``ACE3_SANDBOX=none`` here: the sandboxes' own runs
are tests/security/test_job_limits.py): past its disk limit a job is killed and fails without a
retry; past its memory limit it is killed with the out-of-memory reason and takes the
out-of-memory back-off."""

from __future__ import annotations

import os
import re
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from ace3.errors import OUT_OF_MEMORY_EXIT_CODE
from ace3_control.settings import Settings
from ace3_worker.failures import failure_message
from ace3_worker.job_usage import (
    MAX_DEPTH,
    job_processes,
    memory_bound,
    memory_usage,
    process_table,
)
from ace3_worker.outcome import Outcomes, ran_out_of_memory
from ace3_worker.sandbox.launch import SandboxedProcess, launch
from ace3_worker.sandbox.limits import JobLimits, prlimit_prefix
from ace3_worker.sandbox.plan import SandboxPlan
from ace3_worker.usage_monitor import UsageMonitor, depth_reason
from ace3_worker.watch import AttemptWatch, kill_for

MIB = 1 << 20
DEADLINE = 20.0


def _directory(tmp_path: Path) -> SimpleNamespace:
    for name in ("output", "home", "tmp"):
        (tmp_path / name).mkdir(exist_ok=True)
    return SimpleNamespace(
        root=tmp_path,
        output_dir=tmp_path / "output",
        home_dir=tmp_path / "home",
        tmp_dir=tmp_path / "tmp",
    )


def _start(tmp_path: Path, script: str, limits: JobLimits) -> SandboxedProcess:
    return launch(
        SandboxPlan("none", False, (), ()), _directory(tmp_path), None,  # type: ignore[arg-type]
        [sys.executable, "-c", textwrap.dedent(script)], {"PATH": os.environ["PATH"]},
        share_network=False, device="cpu", limits=limits,
    )  # fmt: skip


@pytest.fixture
def stopped() -> Iterator[tuple[AttemptWatch, list[SandboxedProcess]]]:
    """An attempt's watch, and the processes the test started (killed afterwards)."""
    processes: list[SandboxedProcess] = []
    yield AttemptWatch("job", 1), processes
    for process in processes:
        process.kill()
        process.wait()
        process.close()


def _monitor(
    limits: JobLimits, tmp_path: Path, process: SandboxedProcess, watch: AttemptWatch
) -> tuple[UsageMonitor, threading.Event]:
    """A started monitor that kills ``process`` the way the attempt does."""
    fired = threading.Event()

    def on_limit(reason: str, out_of_memory: bool) -> None:
        kill_for(watch, process, reason, out_of_memory=out_of_memory)
        fired.set()

    monitor = UsageMonitor(limits, _directory(tmp_path), process, None, on_limit)  # type: ignore[arg-type]
    return monitor.start(), fired


WRITER = """
    import os, sys
    block = b"\\xa5" * (1 << 20)
    for index in range(100_000):
        with open(os.path.join(sys.argv[1], f"part-{index}"), "wb") as file:
            for _ in range(4):
                file.write(block)
"""


def test_a_job_past_its_disk_limit_is_killed_and_fails_without_a_retry(
    tmp_path: Path, stopped: tuple[AttemptWatch, list[SandboxedProcess]]
) -> None:
    watch, processes = stopped
    limits = JobLimits(1 << 30, 512, None, disk_bytes=16 * MIB, check_seconds=0.05)
    process = _start(tmp_path, WRITER.replace("sys.argv[1]", repr(str(tmp_path / "tmp"))), limits)
    processes.append(process)
    monitor, fired = _monitor(limits, tmp_path, process, watch)
    try:
        assert fired.wait(DEADLINE), "the writer was not stopped"
        returncode = process.wait(timeout=DEADLINE)
    finally:
        monitor.stop()
    assert returncode == -signal.SIGKILL and watch.run.killed
    reason = watch.run.stopped_for or ""
    seen = re.fullmatch(
        r"the job's files passed ACE3_JOB_DISK_BYTES: its output, home and temporary "
        r"directories held (\d+) bytes, the limit is 16777216",
        reason,
    )
    assert seen and int(seen.group(1)) > 16 * MIB, reason
    assert not ran_out_of_memory(watch)
    outcomes = Outcomes(Settings(), None, limits)  # type: ignore[arg-type]
    assert outcomes.failure(watch, returncode) == (f"training stopped: {reason}", False)
    node = outcomes.node_exit(watch, returncode)
    assert node.exit_code == 1 and node.stopped is None, "a failure, not a signal to retry"


def test_a_job_with_more_files_than_it_may_hold_is_stopped(tmp_path: Path) -> None:
    directory = _directory(tmp_path)
    for index in range(1200):
        (tmp_path / "home" / str(index)).touch()
    reasons: list[tuple[str, bool]] = []
    limits = JobLimits(1 << 30, 512, None, disk_bytes=1 << 30, max_files=1000)
    process = SimpleNamespace(cgroup=None, returncode=0)  # (no processes: files only)
    monitor = UsageMonitor(limits, directory, process, None, lambda *r: reasons.append(r))  # type: ignore[arg-type]
    monitor.check_disk()
    assert reasons == [
        (
            "the job's files passed ACE3_JOB_MAX_FILES: its output, home and temporary "
            "directories held more than 1000 files and directories",
            False,
        )
    ]

    (tmp_path / "home").rename(tmp_path / "many")
    (tmp_path / "home" / Path(*["n"] * (MAX_DEPTH + 1))).mkdir(parents=True)
    reasons.clear()
    UsageMonitor(limits, directory, process, None, lambda *r: reasons.append(r)).check_disk()  # type: ignore[arg-type]
    assert reasons == [(depth_reason(), False)] and "more than 100 deep" in depth_reason()


HOLDER = """
    import os, sys, time
    held = [b"\\x01" * (16 << 20) for _ in range({chunks})]
    child = os.fork()  # (its copy of the pages is the parent's until written)
    if child == 0:
        more = b"\\x02" * (24 << 20)
    print("holding", flush=True)
    time.sleep(600)
"""


def test_a_job_whose_processes_pass_its_memory_limit_together_is_killed_and_backs_off(
    tmp_path: Path, stopped: tuple[AttemptWatch, list[SandboxedProcess]]
) -> None:
    watch, processes = stopped
    limits = JobLimits(80 * MIB, 512, None, check_seconds=0.05)
    process = _start(tmp_path, HOLDER.format(chunks=4), limits)  # 64 MiB, then 24 MiB more
    processes.append(process)
    monitor, fired = _monitor(limits, tmp_path, process, watch)
    try:
        assert fired.wait(DEADLINE), "the processes were not stopped"
        returncode = process.wait(timeout=DEADLINE)
    finally:
        monitor.stop()
    reason = watch.run.stopped_for or ""
    used = re.fullmatch(
        r"out of memory: the job's processes used (\d+) bytes, the limit is 83886080 "
        r"\(ACE3_JOB_MEMORY_BYTES\)",
        reason,
    )
    assert used and 80 * MIB < int(used.group(1)) < 140 * MIB, reason
    assert watch.run.out_of_memory and ran_out_of_memory(watch)
    outcomes = Outcomes(Settings(), None, limits)  # type: ignore[arg-type]
    assert outcomes.node_exit(watch, returncode).exit_code == OUT_OF_MEMORY_EXIT_CODE
    halved: list[tuple[str, int, str | None]] = []

    def halve(job: SimpleNamespace, attempt: int, stopped_for: str | None = None) -> bool:
        halved.append((job.id, attempt, stopped_for))
        return True

    outcomes.halve_micro_batch = halve  # type: ignore[assignment,method-assign]
    outcomes.record_attempt(
        SimpleNamespace(id="job"),
        watch,
        returncode,
        SimpleNamespace(summary=None),  # type: ignore[arg-type]
    )
    assert halved == [("job", 1, reason)], "the out-of-memory back-off applies"


def test_processes_under_the_memory_limit_together_are_left_alone(
    tmp_path: Path, stopped: tuple[AttemptWatch, list[SandboxedProcess]]
) -> None:
    _, processes = stopped
    limits = JobLimits(256 * MIB, 512, None)
    process = _start(tmp_path, HOLDER.format(chunks=4), limits)
    processes.append(process)
    assert process.process.stdout is not None
    assert process.process.stdout.readline() == b"holding\n"
    reasons: list[tuple[str, bool]] = []
    monitor = UsageMonitor(
        limits, _directory(tmp_path), process, None, lambda *r: reasons.append(r)
    )  # type: ignore[arg-type]
    monitor.check_memory()
    assert reasons == [] and monitor.peak_memory == 0  # (its bound was under: no PSS was read)
    running = job_processes(process_table(), process.pid, None)
    usage = memory_usage(running, 0)
    assert 64 * MIB <= usage.bytes < 140 * MIB, usage
    assert memory_bound(running, 0) >= usage.bytes, "the cheap bound must bound the PSS"


def test_the_file_size_backstop_is_the_disk_limit_and_is_named() -> None:
    limits = JobLimits(1 << 30, 512, None, disk_bytes=64 * MIB)
    assert f"--fsize={64 * MIB}:{64 * MIB}" in prlimit_prefix(limits)
    message = failure_message(1, [(0, "OSError: [Errno 27] File too large")], [], None, limits)
    assert "a job's files may hold 67108864 bytes: ACE3_JOB_DISK_BYTES" in message


def test_the_limits_are_read_from_their_variables_and_default_to_a_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACE3_JOB_DISK_BYTES", str(64 * MIB))
    monkeypatch.setenv("ACE3_JOB_MEMORY_BYTES", str(512 * MIB))
    monkeypatch.setenv("ACE3_JOB_USAGE_CHECK_SECONDS", "0.2")
    limits = JobLimits.from_settings(Settings(work_dir=tmp_path))
    assert (limits.disk_bytes, limits.memory_bytes, limits.check_seconds) == (
        64 * MIB,
        512 * MIB,
        0.2,
    )
    assert (limits.max_files, limits.cgroup_root) == (1_000_000, None)
    monkeypatch.delenv("ACE3_JOB_DISK_BYTES")
    shared = Settings(work_dir=tmp_path / "not" / "made" / "yet", worker_slots=3)
    info = os.statvfs(tmp_path)
    size = info.f_blocks * info.f_frsize  # (its size: what is free varies as jobs write)
    assert shared.resolved_job_disk_bytes == size // 4
    with pytest.raises(ValueError, match="job_disk_bytes"):
        Settings(job_disk_bytes=1000)
    with pytest.raises(ValueError, match="job_usage_check_seconds"):
        Settings(job_usage_check_seconds=0)
