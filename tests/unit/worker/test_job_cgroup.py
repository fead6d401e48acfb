"""Job memory cgroups (ace3_worker.sandbox.cgroup) against a fake cgroup v2 tree: this machine
has cgroup v1 only, so the kernel's side is played by a directory whose mkdir makes the
interface files and whose rmdir refuses a cgroup that holds a process, like cgroupfs. What is
real: the files the worker writes and reads, and the shell that joins the cgroup before it
becomes the sandbox's command."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from ace3_worker.sandbox import cgroup as cgroups
from ace3_worker.sandbox.cgroup import (
    CgroupUnavailableError,
    JobCgroup,
    check_cgroup_root,
    filesystem_type,
    sweep_cgroups,
)
from ace3_worker.sandbox.launch import launch
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.sandbox.plan import SandboxPlan
from ace3_worker.usage_monitor import UsageMonitor, memory_reason

INTERFACE = ("cgroup.procs", "cgroup.events", "memory.max", "memory.swap.max",
             "memory.oom.group", "memory.events", "memory.current", "memory.peak")  # fmt: skip

MOUNTINFO = (
    "25 30 0:23 / /sys rw,nosuid - sysfs sysfs rw\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    "42 31 0:39 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "50 30 0:40 / /srv/with\\040space rw - cgroup2 cgroup2 rw\n"
)


def test_the_filesystem_of_a_path_is_its_longest_mount_point_s() -> None:
    assert filesystem_type(Path("/sys/fs/cgroup/unified/ace3"), MOUNTINFO) == "cgroup2"
    assert filesystem_type(Path("/sys/fs/cgroup/memory/x"), MOUNTINFO) == "cgroup"
    assert filesystem_type(Path("/sys/kernel"), MOUNTINFO) == "sysfs"
    assert filesystem_type(Path("/srv/with space/jobs"), MOUNTINFO) == "cgroup2"
    assert filesystem_type(Path("/home"), MOUNTINFO) is None


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A delegated cgroup v2 directory of a fake cgroupfs mounted at ``tmp_path``."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(MOUNTINFO + f"60 30 0:41 / {tmp_path} rw - cgroup2 cgroup2 rw\n")
    monkeypatch.setattr(cgroups, "MOUNTINFO", mountinfo)
    real_mkdir, real_rmdir = Path.mkdir, Path.rmdir

    def mkdir(self: Path, *args: object, **kwargs: object) -> None:
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]
        if self.parent.name == "delegated":
            for name in INTERFACE:
                (self / name).write_text("")

    def rmdir(self: Path) -> None:
        if self.parent.name == "delegated":
            if (self / "cgroup.procs").read_text().strip():
                raise OSError(errno.EBUSY, "Device or resource busy")
            for name in INTERFACE:
                (self / name).unlink(missing_ok=True)
        real_rmdir(self)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(Path, "rmdir", rmdir)
    delegated = tmp_path / "delegated"
    real_mkdir(delegated)
    (delegated / "cgroup.controllers").write_text("cpu io memory pids\n")
    (delegated / "cgroup.subtree_control").write_text("\n")
    return delegated


def test_the_root_is_checked_and_gets_the_memory_controller_for_its_children(
    root: Path, tmp_path: Path
) -> None:
    check_cgroup_root(root, cgroups.MOUNTINFO)
    assert (root / "cgroup.subtree_control").read_text() == "+memory\n"
    (root / "cgroup.controllers").write_text("hugetlb\n")  # (a hybrid machine's unified tree)
    with pytest.raises(CgroupUnavailableError, match=r"no memory controller .*hugetlb"):
        check_cgroup_root(root, cgroups.MOUNTINFO)
    with pytest.raises(CgroupUnavailableError, match="not a directory of a cgroup v2 hierarchy"):
        check_cgroup_root(Path(__file__).parent, Path("/proc/self/mountinfo"))


def test_a_sandbox_s_cgroup_is_limited_joined_read_and_removed(root: Path) -> None:
    cgroup = JobCgroup.create(root, 300 << 20)
    assert cgroup.path.parent == root and cgroup.path.name.startswith(f"ace3-{os.getpid()}-")
    assert (cgroup.path / "memory.max").read_text() == f"{300 << 20}\n"
    assert (cgroup.path / "memory.swap.max").read_text() == "0\n"
    assert (cgroup.path / "memory.oom.group").read_text() == "1\n"

    joined = subprocess.run(
        cgroup.wrap(["sh", "-c", 'echo "ran as $$"']), capture_output=True, text=True, timeout=30
    )
    pid = (cgroup.path / "cgroup.procs").read_text().strip()
    assert joined.stdout == f"ran as {pid}\n", "the command is the process that joined"

    assert cgroup.oom_kills() == 0
    (cgroup.path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n")
    (cgroup.path / "memory.peak").write_text(f"{301 << 20}\n")
    assert cgroup.oom_kills() == 1
    assert not cgroup.remove(wait=0.1), "a cgroup holding a process stays"
    (cgroup.path / "cgroup.procs").write_text("")
    assert cgroup.remove(wait=0.1) and not cgroup.path.exists()
    assert (cgroup.oom_kills(), cgroup.peak_bytes()) == (1, 301 << 20), "read before removal"


def test_a_kernel_without_swap_accounting_gets_memory_max_alone(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(
        globals(), "INTERFACE", tuple(name for name in INTERFACE if name != "memory.swap.max")
    )
    cgroup = JobCgroup.create(root, 1 << 30)
    assert not (cgroup.path / "memory.swap.max").exists()
    assert (cgroup.path / "memory.max").read_text() == f"{1 << 30}\n"


def test_the_sandbox_runs_in_its_cgroup_and_the_oom_kill_is_the_job_s_reason(
    root: Path, tmp_path: Path
) -> None:
    limits = JobLimits(1 << 30, 512, None, cgroup_root=root)
    directory = SimpleNamespace(
        root=tmp_path, output_dir=tmp_path, home_dir=tmp_path, tmp_dir=tmp_path
    )
    plan = SandboxPlan("none", False, (), ())
    process = launch(
        plan, directory, None, ["sh", "-c", "echo $$"], {"PATH": os.environ["PATH"]},  # type: ignore[arg-type]
        share_network=False, device="cpu", limits=limits,
    )  # fmt: skip
    assert process.cgroup is not None
    cgroup = process.cgroup
    assert process.process.stdout is not None
    assert process.process.stdout.read().decode().strip() == str(process.pid)
    assert (cgroup.path / "cgroup.procs").read_text().strip() == str(process.pid)
    (cgroup.path / "memory.events").write_text("oom 1\noom_kill 2\n")
    (cgroup.path / "memory.peak").write_text(f"{(1 << 30) + 4096}\n")
    reasons: list[tuple[str, bool]] = []
    monitor = UsageMonitor(
        limits,
        directory,
        process,
        None,
        lambda *reason: reasons.append(reason),  # type: ignore[arg-type]
    )
    process.wait()
    (cgroup.path / "cgroup.procs").write_text("")  # (the kernel: its processes are gone)
    process.close()
    assert not cgroup.path.exists(), "removed when the sandbox is closed"
    monitor.stop()  # (its last look, after the sandbox was closed)
    assert reasons == [(memory_reason((1 << 30) + 4096, 1 << 30), True)]
    assert reasons[0][0].startswith(
        "out of memory: the job's processes used 1073745920 bytes, the limit is 1073741824"
    )


def test_cgroups_of_dead_workers_are_swept(root: Path) -> None:
    dead = _dead_pid()
    for name in (f"ace3-{dead}-ab12", f"ace3-{os.getpid()}-cd34", "someone-else"):
        (root / name).mkdir()
    assert sweep_cgroups(root) == [root / f"ace3-{dead}-ab12"]
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        f"ace3-{os.getpid()}-cd34",
        "someone-else",
    ]


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid
