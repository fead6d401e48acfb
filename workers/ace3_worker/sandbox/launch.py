"""Start one attempt's torchrun inside its sandbox, and stop it: SIGTERM that reaches the ranks,
SIGKILL that reaches every process.

Stopping is where the sandbox changes things. Bubblewrap forwards no signal: a SIGTERM to the
``bwrap`` process kills it, and its ``--die-with-parent`` then SIGKILLs the sandbox at once, so
cancellation's grace period would be lost. So :meth:`SandboxedProcess.terminate` sends SIGTERM
to torchrun itself (the only child of the sandbox's init, whose PID in this namespace bubblewrap
reports on ``--info-fd``); torchrun passes it to every rank. :meth:`SandboxedProcess.kill`
SIGKILLs the process group, which holds ``bwrap`` and the sandbox's init: when the init of a PID
namespace dies the kernel kills everything in it, however a process detached itself. Without
namespaces (``ACE3_SANDBOX=uid``) SIGTERM goes to torchrun's process group and SIGKILL also to
every process of the job's uid.

Where the worker has a delegated cgroup v2 directory (``ACE3_JOB_CGROUP_ROOT``), each sandbox
runs in a memory cgroup of its own (:mod:`ace3_worker.sandbox.cgroup`), joined before anything
of it runs and removed when it is closed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from ace3.runtime.process import parent_death
from ace3_worker.job_dir import JobDirectory, JobOwner
from ace3_worker.job_usage import used_bytes
from ace3_worker.sandbox.bubblewrap import SandboxView, UidSwitch, bubblewrap_argv, setpriv_prefix
from ace3_worker.sandbox.cgroup import JobCgroup
from ace3_worker.sandbox.gpus import gpu_device_nodes
from ace3_worker.sandbox.identity import JobIdentity, kill_processes_of, tasks_of
from ace3_worker.sandbox.limits import JobLimits, prlimit_prefix
from ace3_worker.sandbox.plan import SandboxPlan
from ace3_worker.sandbox.seccomp import filter_program

logger = logging.getLogger(__name__)

INFO_TIMEOUT_SECONDS = 30.0


def sandbox_environment(
    base: dict[str, str], directory: JobDirectory, owner: JobOwner | None, job_id: str | None
) -> dict[str, str]:
    """The ranks' environment inside the sandbox: the launcher's allow-list plus where the
    job's home and temporary directory are, its user name and job id."""
    env = dict(base)
    env["HOME"] = str(directory.visible(directory.home_dir))
    env["TMPDIR"] = (
        "/tmp"
        if directory.visible_root != PurePosixPath(directory.root)
        else str(directory.tmp_dir)
    )
    env["USER"] = env["LOGNAME"] = owner.user_name if owner else "job"
    if job_id is not None:
        env["ACE3_JOB_ID"] = job_id
    runtime_bin = os.path.dirname(sys.executable)
    env["PATH"] = f"{runtime_bin}:/usr/local/bin:/usr/bin:/bin"
    return env


@dataclass
class SandboxedProcess:
    """One attempt's torchrun, running in its sandbox."""

    process: subprocess.Popen[bytes]
    plan: SandboxPlan
    identity: JobIdentity | None
    cgroup: JobCgroup | None = None  # its memory cgroup (ACE3_JOB_CGROUP_ROOT)
    _init_pid: int | None = None
    _init_pidfd: int | None = None  # (signals through it can never reach a reused PID)
    _info_ready: threading.Event = field(default_factory=threading.Event)

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        self.process.poll()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self.process.wait(timeout)
        assert self.returncode is not None
        return self.returncode

    @property
    def returncode(self) -> int | None:
        """torchrun's exit status, negative when a signal killed it (bubblewrap reports a
        child killed by signal N as 128 + N; torchrun itself only exits 0 or 1)."""
        code = self.process.returncode
        if code is not None and self.plan.mode == "bwrap" and code > 128:
            return -(code - 128)
        return code

    def _read_info(self, read_fd: int) -> None:
        """bubblewrap's --info-fd: ``{"child-pid": N}``, the sandbox init's PID here."""
        data = b""
        try:
            while chunk := os.read(read_fd, 4096):  # (bwrap may keep the pipe open)
                data += chunk
                with contextlib.suppress(ValueError):
                    self._init_pid = int(json.loads(data)["child-pid"])
                    break
                if len(data) > 65536:
                    break
        except (OSError, KeyError, TypeError):
            pass
        finally:
            os.close(read_fd)
            if self._init_pid is not None:
                self._init_pidfd = _pidfd_of_child(self._init_pid, self.process.pid)
                if self._init_pidfd is None:
                    self._init_pid = None
            if self._init_pid is None:
                logger.warning("bubblewrap reported no child PID; SIGTERM goes to its group")
            self._info_ready.set()

    def _init_alive(self) -> bool:
        """Whether the sandbox's init still runs (while it does, its PID is its own)."""
        if self._init_pidfd is None:
            return False
        try:
            signal.pidfd_send_signal(self._init_pidfd, 0)
        except (ProcessLookupError, PermissionError, OSError):
            return False
        return True

    def shm_bytes(self) -> int | None:
        """What the sandbox's own ``/dev/shm`` holds (seen through its init's root, which is
        checked alive after the read: the number was not another process's meanwhile); None
        without one (not bubblewrap, or its init is not known or gone)."""
        if self.plan.mode != "bwrap" or self._init_pid is None or not self._init_alive():
            return None
        used = used_bytes(Path(f"/proc/{self._init_pid}/root/dev/shm"))
        return used if self._init_alive() else None

    def _torchrun_pid(self) -> int | None:
        """torchrun: the child of the sandbox's init (found by its parent PID)."""
        if self._init_pid is None or not self._init_alive():
            return None
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as file:
                    fields = file.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if len(fields) > 1 and int(fields[1]) == self._init_pid:
                return int(entry.name)
        return None

    def terminate(self) -> None:
        """SIGTERM to torchrun (which passes it to every rank)."""
        if self.plan.mode == "bwrap":
            self._info_ready.wait(timeout=INFO_TIMEOUT_SECONDS)
            target = self._torchrun_pid()
            if target is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(target, signal.SIGTERM)
                return
            logger.warning("torchrun of the sandbox not found; stopping the sandbox")
        _signal_group(self.process, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to every process of the attempt."""
        _signal_group(self.process, signal.SIGKILL)
        if self._init_pidfd is not None:  # (forced from the parent namespace, kills all of it)
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                signal.pidfd_send_signal(self._init_pidfd, signal.SIGKILL)
        if self.identity is not None:
            kill_processes_of(self.identity.uid)

    def close(self) -> None:
        """Release the handle on the sandbox's init and remove its cgroup (once the attempt is
        over: its processes were killed)."""
        if self._init_pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._init_pidfd)
            self._init_pidfd = None
        if self.cgroup is not None:
            self.cgroup.remove()


def _pidfd_of_child(pid: int, parent: int) -> int | None:
    """A pidfd for ``pid``, checked to be ``parent``'s child after it was opened (so it is
    the process bubblewrap reported, not one that took over its PID)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            ppid = int(file.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        ppid = -1
    if ppid != parent:
        os.close(pidfd)
        return None
    return pidfd


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the attempt's process group, only while its leader is unreaped (after that
    its number may belong to someone else)."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _parent_death_prefix() -> list[str]:
    """torchrun is SIGKILLed by the kernel if this supervisor dies (ace3.runtime.process.parent_death);
    inside bubblewrap, ``--die-with-parent`` does that. The module is started by its path:
    ``-m`` would import the ``ace3`` package (the SDK, about 0.6 s) before torchrun even
    starts, for a module that needs only the standard library."""
    if sys.platform.startswith("linux"):
        return [sys.executable, os.path.abspath(parent_death.__file__), str(os.getpid())]
    return []


def launch(
    plan: SandboxPlan,
    directory: JobDirectory,
    identity: JobIdentity | None,
    command: list[str],
    env: dict[str, str],
    *,
    share_network: bool,
    device: str,
    limits: JobLimits,
    inherited_fds: tuple[int, ...] = (),
) -> SandboxedProcess:
    """Start ``command`` (torchrun, or a warm launcher) for the attempt in ``directory`` under
    ``plan``; ``inherited_fds`` stay open in it at the same numbers (the caller closes its
    copies)."""
    pass_fds: list[int] = []
    info_read: int | None = None
    if device == "cuda":  # (GPU indices mean PCI bus order, as the bound device nodes do)
        env = {**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if identity is None and plan.mode != "none":
        # (the job shares the worker's uid, whose threads the kernel counts together)
        limits = replace(limits, max_processes=limits.max_processes + tasks_of(os.getuid()))
    prefix = prlimit_prefix(limits) if plan.mode != "none" else []
    if plan.mode == "bwrap":
        seccomp_read, seccomp_write = os.pipe()
        os.write(seccomp_write, filter_program())
        os.close(seccomp_write)
        info_read, info_write = os.pipe()
        pass_fds = [seccomp_read, info_write]
        view = SandboxView(
            job_root=directory.root,
            writable=(
                (directory.output_dir, directory.visible(directory.output_dir)),
                (directory.home_dir, directory.visible(directory.home_dir)),
                (directory.tmp_dir, PurePosixPath("/tmp")),
            ),
            read_only_files=tuple(
                (directory.etc_dir / name, PurePosixPath(f"/etc/{name}"))
                for name in ("passwd", "group", *(() if share_network else ("hosts",)))
            ),
            runtime_paths=plan.runtime_paths,
            hidden=plan.hidden,
            share_network=share_network,
            device_nodes=gpu_device_nodes(env.get("CUDA_VISIBLE_DEVICES"))
            if device == "cuda"
            else (),  # (indices in PCI order, as ace3_worker.sandbox.gpus resolves them)
            shm_bytes=limits.memory_bytes,
            env=env,
            switch=UidSwitch(identity.uid, identity.gid) if identity else None,
        )
        argv = prefix + bubblewrap_argv(view, command, seccomp_fd=seccomp_read, info_fd=info_write)
    elif plan.mode == "uid":
        assert identity is not None
        argv = (
            prefix
            + setpriv_prefix(identity.uid, identity.gid, no_new_privs=True)
            + _parent_death_prefix()
            + command
        )
    else:
        argv = _parent_death_prefix() + command
    cgroup = None
    try:
        if limits.cgroup_root is not None:
            cgroup = JobCgroup.create(limits.cgroup_root, limits.memory_bytes)
            argv = cgroup.wrap(argv)
        process = subprocess.Popen(
            argv,
            cwd=directory.root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=[*pass_fds, *inherited_fds],
        )
    except BaseException:
        if cgroup is not None:
            cgroup.remove(wait=0)
        raise
    finally:
        for fd in pass_fds:
            os.close(fd)
    sandboxed = SandboxedProcess(process, plan, identity, cgroup)
    if info_read is not None:
        threading.Thread(
            target=sandboxed._read_info, args=(info_read,), daemon=True, name="ace3-bwrap-info"
        ).start()
    else:
        sandboxed._info_ready.set()
    return sandboxed
