"""The sandbox's parts: the bubblewrap command line (what a job sees), the seccomp filter, the uid
leases, the log limiter and the reading of torchrun's failure summary."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from ace3_worker.failures import RankFailure, failure_message, root_cause
from ace3_worker.log_limits import LogLimiter
from ace3_worker.sandbox.bubblewrap import SandboxView, UidSwitch, bubblewrap_argv
from ace3_worker.sandbox.identity import (
    NoFreeIdentityError,
    check_uid_range,
    lease_identity,
)
from ace3_worker.sandbox.limits import JobLimits, prlimit_prefix
from ace3_worker.sandbox.seccomp import filter_program

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0,
    reason="needs bubblewrap and root (CI installs bubblewrap and runs as root)",
)


def _fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "usr").mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    (root / "etc").mkdir()
    (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n")
    (root / "etc" / "shadow").write_text("root:secret\n")
    return root


def _pairs(argv: list[str], option: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, arg in enumerate(argv) if arg == option]


def test_the_view_holds_the_job_its_python_and_only_a_few_system_files(tmp_path: Path) -> None:
    root = _fake_root(tmp_path)
    job = tmp_path / "work" / "job" / "attempt-1"
    venv = tmp_path / "srv" / "app" / ".venv"
    (venv / "data").mkdir(parents=True)
    (venv / "ace3.db").write_text("")
    view = SandboxView(
        job_root=job,
        writable=(
            (job / "output", PurePosixPath("/job/output")),
            (job / "tmp", PurePosixPath("/tmp")),
        ),
        read_only_files=((job / "etc" / "passwd", PurePosixPath("/etc/passwd")),),
        runtime_paths=(Path("/opt/python"), venv, Path("/usr/lib/python3")),
        hidden=(venv / "data", venv / "ace3.db", tmp_path / "srv" / "data"),
        env={"PATH": "/usr/bin", "HOME": "/job/home"},
        switch=UidSwitch(61000, 61000),
    )
    argv = bubblewrap_argv(view, ["python", "-m", "x"], seccomp_fd=7, info_fd=8, root=root)
    ro = _pairs(argv, "--ro-bind")
    assert (str(root / "usr"), "/usr") in ro and ("usr/lib", "/lib") in _pairs(argv, "--symlink")
    assert (str(root / "etc" / "hosts"), "/etc/hosts") in ro
    assert not any("shadow" in source for source, _ in ro), "only the listed /etc files"
    assert (str(job), "/job") in ro and (str(job / "etc" / "passwd"), "/etc/passwd") in ro
    assert (str(job / "output"), "/job/output") in _pairs(argv, "--bind")
    assert ("/opt/python", "/opt/python") in ro and (str(venv), str(venv)) in ro
    assert ("/usr/lib/python3", "/usr/lib/python3") not in ro, "already inside /usr"
    tmpfs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--tmpfs"]
    assert str(venv / "data") in tmpfs, "a service path under a bound directory is hidden"
    assert ("/dev/null", str(venv / "ace3.db")) in ro, "and a file too"
    assert str(tmp_path / "srv" / "data") not in tmpfs, "one nothing exposes needs no hiding"
    assert "--clearenv" in argv and ("HOME", "/job/home") in _pairs(argv, "--setenv")
    assert {"--unshare-pid", "--unshare-net", "--die-with-parent"} <= set(argv)
    assert "--unshare-user" not in argv, "root: no user namespace; the uid is switched inside"
    assert argv[argv.index("--") + 1 :] == [
        "setpriv", "--reuid=61000", "--regid=61000", "--clear-groups", "--inh-caps=-all",
        "--bounding-set=-all", "--", "python", "-m", "x",
    ]  # fmt: skip
    assert argv.index("--cap-drop") < argv.index("--")


def test_a_multi_node_view_shares_the_network_and_a_non_root_one_uses_a_user_namespace(
    tmp_path: Path,
) -> None:
    view = SandboxView(
        job_root=tmp_path, writable=(), read_only_files=(), runtime_paths=(), share_network=True
    )
    argv = bubblewrap_argv(view, ["true"], seccomp_fd=None, info_fd=None, root=_fake_root(tmp_path))
    assert "--unshare-net" not in argv and "--hostname" not in argv
    assert {"--unshare-user", "--disable-userns"} <= set(argv)
    assert "setpriv" not in argv


def test_rlimits_cover_memory_processes_cpu_and_core_files() -> None:
    assert prlimit_prefix(JobLimits(1 << 30, 512, 60)) == [
        "prlimit", f"--data={1 << 30}:{1 << 30}", "--nproc=512:512", "--core=0:0",
        "--cpu=60:65", "--",
    ]  # fmt: skip
    assert "--cpu" not in " ".join(prlimit_prefix(JobLimits(1 << 30, 512, None)))


def test_uids_are_leased_one_job_at_a_time(tmp_path: Path) -> None:
    base = 3_000_000_000 // 2  # (no account has these)
    first = lease_identity(tmp_path, base, 2)
    second = lease_identity(tmp_path, base, 2)
    assert {first.uid, second.uid} == {base, base + 1}
    with pytest.raises(NoFreeIdentityError, match="ACE3_SANDBOX_UID_COUNT"):
        lease_identity(tmp_path, base, 2)
    first.release()
    assert lease_identity(tmp_path, base, 2).uid == first.uid


def test_a_uid_range_that_holds_an_account_is_refused() -> None:
    with pytest.raises(ValueError, match="ACE3_SANDBOX_UID_BASE"):
        check_uid_range(0, 1)  # root


def test_a_range_that_holds_only_a_group_is_refused_too() -> None:
    import grp
    import pwd

    users = {entry.pw_uid for entry in pwd.getpwall()}
    groups_only = [entry for entry in grp.getgrall() if entry.gr_gid not in users]
    if not groups_only:
        pytest.skip("every group here shares its number with an account")
    group = groups_only[0]
    with pytest.raises(ValueError, match=f"gid {group.gr_gid} belongs to the group"):
        check_uid_range(group.gr_gid, 1)


def test_the_log_limiter_passes_bursts_then_drops_and_counts() -> None:
    limiter = LogLimiter(lines_per_second=10, bytes_per_second=1e9, max_total_bytes=10**9)
    admitted = sum(limiter.admit(10) for _ in range(500))
    assert 100 <= admitted < 110, "a burst of ten seconds' worth, then the rate"
    marker = limiter.take_dropped()
    assert marker is not None and marker.startswith(f"ace3: {500 - admitted} log lines dropped")
    assert limiter.take_dropped() is None
    capped = LogLimiter(lines_per_second=1e9, bytes_per_second=1e12, max_total_bytes=1000)
    assert sum(capped.admit(100) for _ in range(50)) == 10
    assert "reached 1000 bytes" in (capped.take_dropped() or "")


TORCHRUN_SUMMARY = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
ace3.runtime FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-23_21:53:51
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 9878)  (SIGTERM)
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-23_21:53:51
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 9879)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 9879
======================================================""".splitlines()


def test_a_rank_killed_by_a_signal_is_named_and_retryable() -> None:
    cause = root_cause(TORCHRUN_SUMMARY)
    assert cause == RankFailure(rank=1, exit_code=-9)
    assert cause.retryable and cause.headline() == "rank 1 killed by SIGKILL (out of memory?)"
    message = failure_message(1, [(1, "step 3")], TORCHRUN_SUMMARY, cause)
    assert message.splitlines()[:2] == [
        "training failed: rank 1 killed by SIGKILL (out of memory?)",
        "step 3",
    ]
    assert not RankFailure(0, -int(signal.SIGXCPU)).retryable, "it would use up its limit again"
    assert not RankFailure(0, 1).retryable and root_cause(["no summary"]) is None


def test_a_killed_rank_is_the_cause_even_when_a_peer_s_error_was_seen_first() -> None:
    echo = [
        "Failures:",
        "[1]:",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -9 (pid: 12)  (SIGKILL)",
        "[2]:",
        "  rank      : 2 (local_rank: 2)",
        "  exitcode  : -15 (pid: 13)  (SIGTERM)",
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : 1 (pid: 11)",
    ]
    peer_died = [
        (0, "RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer")
    ]
    assert root_cause(echo, peer_died) == RankFailure(rank=1, exit_code=-9)
    own_error = [(0, "ValueError: bad shape")]
    assert root_cause(echo, own_error) == RankFailure(rank=0, exit_code=1), (
        "a rank that failed on its own stays the cause (its peers were killed after it)"
    )
    terminated_only = [line for line in echo if "rank      : 1" not in line and "-9" not in line]
    assert root_cause(terminated_only, peer_died) == RankFailure(rank=0, exit_code=1), (
        "torchrun's own SIGTERM to the survivors is no cause"
    )


def test_limits_are_named_when_a_rank_meets_one() -> None:
    limits = JobLimits(1 << 30, 512, None)
    memory = failure_message(1, [(0, "MemoryError")], [], None, limits)
    assert "each process of a job may allocate 1024 MiB" in memory.splitlines()[0]
    forks = failure_message(
        1, [(0, "BlockingIOError: [Errno 11] Resource temporarily unavailable")], [], None, limits
    )
    assert "a job may run 512 processes and threads" in forks.splitlines()[0]


@needs_bwrap
def test_the_seccomp_filter_refuses_user_namespaces_and_allows_threads(tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, filter_program())
    os.close(write_fd)
    script = (
        "import ctypes, os, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"
        "print('keyctl', libc.syscall(250 if os.uname().machine == 'x86_64' else 219, 0), "
        "ctypes.get_errno())\n"
        "t = threading.Thread(target=print, args=('thread ran',)); t.start(); t.join()\n"
    )
    try:
        result = subprocess.run(
            ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--seccomp",
             str(read_fd), "--", sys.executable, "-c", script],
            capture_output=True, text=True, pass_fds=(read_fd,), timeout=60,
        )  # fmt: skip
    finally:
        os.close(read_fd)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "unshare -1 1" in lines, "EPERM"
    assert "keyctl -1 1" in lines
    assert "thread ran" in lines, "clone3 answers ENOSYS and threads still start (via clone)"


@needs_bwrap
def test_the_worker_checks_its_sandbox_for_real_when_it_starts(tmp_path: Path) -> None:
    from ace3_control.settings import Settings
    from ace3_worker.sandbox.plan import SandboxUnavailableError, resolve_sandbox

    data = tmp_path / "data"
    data.mkdir()
    # Uids of their own (with a lock directory of their own): a worker of the test stack, or
    # of another run on this machine, kills what runs under its job uids when a job ends.
    uids = {"sandbox_uid_base": 61800, "sandbox_uid_count": 8, "sandbox_lock_dir": tmp_path / "l"}
    plan = resolve_sandbox(Settings(data_dir=data, sandbox="bwrap", **uids))
    assert plan.mode == "bwrap" and plan.dedicated_uids
    assert data.resolve() in plan.hidden and (data / "ace3.db").resolve() in plan.hidden
    assert oct(data.stat().st_mode & 0o777) == oct(0o711), "passable, not listable"

    uid_settings = Settings(data_dir=data, sandbox="uid", **uids)
    try:
        fallback = resolve_sandbox(uid_settings)
    except SandboxUnavailableError as exc:  # (this interpreter lives where other uids cannot read)
        assert "readable by other users" in str(exc) and "Permission denied" in str(exc)
    else:
        assert fallback.mode == "uid" and fallback.visible_root is None
    none = resolve_sandbox(Settings(data_dir=data, sandbox="none"))
    assert none.mode == "none" and not none.dedicated_uids


def test_no_signal_reaches_a_pid_once_the_sandbox_is_reaped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the attempt's processes are reaped their PIDs may be anyone's: kill() signals
    nothing by number, and a PID whose parent is not bubblewrap gets no handle."""
    from ace3_worker.sandbox.launch import SandboxedProcess, _pidfd_of_child
    from ace3_worker.sandbox.plan import SandboxPlan

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        assert _pidfd_of_child(sleeper.pid, parent=os.getpid() + 1) is None
        pidfd = _pidfd_of_child(sleeper.pid, parent=os.getpid())
        assert pidfd is not None
        os.close(pidfd)
    finally:
        sleeper.kill()
        sleeper.wait()

    done = subprocess.Popen(["true"], start_new_session=True)
    done.wait()
    signalled: list[int] = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: signalled.append(pid))
    monkeypatch.setattr(os, "kill", lambda pid, sig: signalled.append(pid))
    process = SandboxedProcess(
        done, SandboxPlan(mode="bwrap", dedicated_uids=True, runtime_paths=(), hidden=()), None
    )
    process._init_pid = done.pid  # (what bubblewrap reported, now free for reuse)
    process.kill()
    process.close()
    assert signalled == []
