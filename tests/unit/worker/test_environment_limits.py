"""What bounds an environment's build and what the worker does to its tree, without uv: the disk
watch counts uv's cache and the number of files; taking a tree over keeps exec bits (never
setuid), removes FIFOs, refuses hard links and never follows a name swapped for a link;
nothing of a build's process group outlives it; uv's failures are classified from its own
words; the index credentials never reach bubblewrap's command line."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from ace3_worker.environments import build_limits
from ace3_worker.environments.build_limits import DiskWatch, survivors, wait_gone
from ace3_worker.environments.tree import measure, take_ownership
from ace3_worker.environments.uv_commands import (
    EnvironmentBuildError,
    EnvironmentRefusedError,
    uv_error,
)
from ace3_worker.sandbox.bubblewrap import SandboxView, bubblewrap_argv, secret_arguments

MIB = 1 << 20


def _work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    for name in ("cache", "home", "target"):
        (work / name).mkdir(parents=True)
    return work


def test_the_disk_watch_counts_uvs_cache_against_the_limit(tmp_path: Path) -> None:
    """A build whose target is still empty while uv's cache holds three times the limit."""
    work = _work(tmp_path)
    for index in range(3):
        (work / "cache" / f"part{index}").write_bytes(b"\0" * MIB)
    with pytest.raises(EnvironmentRefusedError, match=r"ACE3_ENV_MAX_BYTES.*uv's cache"):
        DiskWatch(work, work / "target", MIB).check()
    DiskWatch(work, work / "target", 2 * MIB).check()  # (up to twice the limit, transiently)


def test_the_disk_watch_counts_files_against_max_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build_limits, "MAX_FILES", 5)
    monkeypatch.setattr(build_limits, "MAX_WORK_ENTRIES", 10)
    work = _work(tmp_path)
    for index in range(20):
        (work / "cache" / f"empty{index}").touch()
    with pytest.raises(EnvironmentRefusedError, match=r"more than 5 files.*MAX_FILES"):
        DiskWatch(work, work / "target", MIB).check()
    assert measure(work, stop_past_entries=7).entries == 8  # (a huge tree is not walked whole)


def test_taking_a_tree_over_keeps_exec_bits_and_drops_setuid(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "pkg" / "bin").mkdir(parents=True)
    modes = {"pkg/data.py": 0o644, "pkg/bin/ninja": 0o755, "pkg/suid": 0o4755, "pkg/own": 0o700}
    for name, mode in modes.items():
        (tree / name).write_text("x")
        (tree / name).chmod(mode)
    (tree / "pkg" / "bin").chmod(0o3777)  # (setgid, sticky)
    (tree / "pkg" / "link").symlink_to("data.py")
    os.mkfifo(tree / "pkg" / "fifo")
    take_ownership(tree)
    got = {name: stat.S_IMODE((tree / name).stat().st_mode) for name in modes}
    assert got == {"pkg/data.py": 0o444, "pkg/bin/ninja": 0o555, "pkg/suid": 0o555,
                   "pkg/own": 0o555}  # fmt: skip
    assert stat.S_IMODE((tree / "pkg" / "bin").stat().st_mode) == 0o555
    assert stat.S_IMODE(tree.stat().st_mode) == 0o555
    assert (tree / "pkg" / "link").is_symlink() and not (tree / "pkg" / "fifo").exists()
    assert (tree / "pkg" / "data.py").stat().st_uid == os.geteuid()


def test_a_hard_link_out_of_the_tree_is_refused_not_changed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("the worker's")
    outside.chmod(0o600)
    tree = tmp_path / "tree"
    tree.mkdir()
    os.link(outside, tree / "linked")
    with pytest.raises(EnvironmentRefusedError, match="hard link"):
        take_ownership(tree)
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600


def test_a_name_swapped_for_a_link_never_redirects_a_chmod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race a process of the build uid could win were it still running: a file is
    replaced by a link to a file of the worker's right after the walk looked at it."""
    outside = tmp_path / "outside"
    outside.write_text("the worker's")
    outside.chmod(0o600)
    tree = tmp_path / "tree"
    tree.mkdir()
    victim = tree / "victim"
    victim.write_text("x")
    real_stat, real_lstat = os.stat, os.lstat
    swapped: list[bool] = []

    def swap_after(found: os.stat_result, path: object) -> os.stat_result:
        if not swapped and os.path.basename(str(path)) == "victim":
            swapped.append(True)
            victim.unlink()
            victim.symlink_to(outside)
        return found

    def racing_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        return swap_after(real_stat(path, *args, **kwargs), path)  # type: ignore[arg-type]

    def racing_lstat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        return swap_after(real_lstat(path, *args, **kwargs), path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", racing_stat)
    monkeypatch.setattr(os, "lstat", racing_lstat)
    with contextlib.suppress(OSError):  # (refusing the changed tree is right too)
        take_ownership(tree)
    monkeypatch.undo()
    assert swapped
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600


def test_nothing_of_a_steps_process_group_outlives_it() -> None:
    """uv exited, a child it left in its group still runs: it is killed before the tree is
    taken over."""
    process = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    deadline = time.monotonic() + 5
    while len(survivors(process.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert survivors(process.pid)  # (the two sleeps)
    wait_gone(process.pid)
    assert survivors(process.pid) == []


# Real uv 0.13 output (stderr, as the worker reads it) of failures that may pass.
MAY_PASS = {
    "unreachable index": [
        "error: Request failed after 3 retries in 4.6s",
        "  cause: Failed to fetch: http://127.0.0.1:1/simple/tinyx/",
        "  cause: error sending request for url (http://127.0.0.1:1/simple/tinyx/)",
        "  cause: client error (Connect)",
        "  cause: tcp connect error",
        "  cause: Connection refused (os error 111)",
    ],
    "slow index": [
        "error: Request failed after 3 retries in 19.0s",
        "  cause: Failed to fetch: http://127.0.0.1:18013/simple/bigone/",
        "  cause: error sending request for url (http://127.0.0.1:18013/simple/bigone/)",
        "  cause: operation timed out",
    ],
    "index failing": [
        "error: Request failed after 3 retries in 9.0s",
        "  cause: Failed to fetch: http://127.0.0.1:18001/simple/bigone/",
        "  cause: HTTP status server error (500 Internal Server Error) for url "
        "(http://127.0.0.1:18001/simple/bigone/)",
    ],
    "download cut": [
        "Downloading bigone (2.6MiB)",
        "error: Failed to download `bigone==1.0`",
        "  cause: Failed to write to the distribution cache",
        "  cause: error decoding response body",
        "  cause: request or response body error",
        "  cause: error reading a body from connection",
        "  cause: end of file before message length reached",
    ],
    "credentials refused": [
        "error: No solution found when resolving dependencies",
        "  cause: Because bigone was not found in the package registry and you require bigone,"
        " we can conclude that your requirements are unsatisfiable.",
        "hint: An index URL (http://127.0.0.1:18002/simple) could not be queried due to a lack"
        " of valid authentication credentials (401 Unauthorized)",
    ],
    "wheelhouse gone": [
        "error: Failed to read `--find-links` directory: /srv/wheels",
        "  cause: No such file or directory (os error 2)",
    ],
    "disk full unpacking": [
        "error: Failed to download `bigone==1.0`",
        "  cause: Failed to extract archive: /srv/wheels/bigone-1.0-py3-none-any.whl",
        "  cause: I/O operation failed during extraction",
        "  cause: failed to write to file `/build/cache/.tmpnHRvMi/bigone/__init__.py`: No "
        "space left on device (os error 28)",
    ],
    "disk full installing": [
        "error: Failed to install: bigone-1.0-py3-none-any.whl (bigone==1.0)",
        "  cause: Failed to copy to `/build/target/bigone/__init__.py`",
        "  cause: failed to copy file from /build/cache/archive-v0/NM0e52SLuCA342kx/bigone/"
        "__init__.py to /build/target/bigone/.tmphVgxK6: No space left on device (os error 28)",
    ],
    "sandbox": ["bwrap: Can't mount proc on /newroot/proc: Operation not permitted"],
}
REFUSED = {
    "not found": [
        "error: No solution found when resolving dependencies",
        "  cause: Because nopkg was not found in the provided package locations and you "
        "require nopkg, we can conclude that your requirements are unsatisfiable.",
    ],
    "malformed wheel": [
        "error: Failed to download `badpkg==1.0`",
        "  cause: Failed to extract archive: /srv/wheels/badpkg-1.0-py3-none-any.whl",
        "  cause: Invalid zip file structure",
        "  cause: unable to locate the end of central directory record",
    ],
}


@pytest.mark.parametrize("case", sorted(MAY_PASS))
def test_failures_that_may_pass_are_build_errors(case: str) -> None:
    error = uv_error(MAY_PASS[case], 1, MIB)
    assert isinstance(error, EnvironmentBuildError), (case, error)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_failures_that_would_fail_again_are_refused(case: str) -> None:
    error = uv_error(REFUSED[case], 1, MIB)
    assert isinstance(error, EnvironmentRefusedError) and str(error).startswith(
        ("No solution found", "Failed to download")
    ), error


def test_signals_the_file_size_limit_and_the_others() -> None:
    for returncode in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):  # (uv itself; bubblewrap's)
        error = uv_error([], returncode, MIB)
        assert isinstance(error, EnvironmentRefusedError)
        assert f"ACE3_ENV_MAX_BYTES ({MIB} bytes)" in str(error)
    killed = uv_error(["Resolved 3 packages"], 128 + signal.SIGKILL, MIB)
    assert isinstance(killed, EnvironmentBuildError) and "SIGKILL" in str(killed)
    assert isinstance(uv_error([], 2, MIB), EnvironmentBuildError)  # (uv said nothing)


def test_secret_variables_reach_bubblewrap_through_a_pipe_never_its_argv(tmp_path: Path) -> None:
    secret = "https://alice:S3CRET@pypi.example/simple"
    view = SandboxView(
        job_root=tmp_path, writable=(), read_only_files=(), runtime_paths=(),
        env={"PATH": "/usr/bin:/bin"}, secret_env={"UV_INDEX_URL": secret},
    )  # fmt: skip
    argv = bubblewrap_argv(view, ["uv"], seccomp_fd=None, info_fd=None, args_fd=9)
    assert not any("S3CRET" in part for part in argv)
    assert argv.index("--args") > argv.index("--clearenv") and argv[argv.index("--args") + 1] == "9"
    assert secret_arguments(view) == f"--setenv\0UV_INDEX_URL\0{secret}\0".encode()
    with pytest.raises(ValueError, match="never on the command line"):
        bubblewrap_argv(view, ["uv"], seccomp_fd=None, info_fd=None)
    plain = SandboxView(job_root=tmp_path, writable=(), read_only_files=(), runtime_paths=())
    assert "--args" not in bubblewrap_argv(plain, ["x"], seccomp_fd=None, info_fd=None)
