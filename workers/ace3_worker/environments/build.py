"""Building an environment: uv resolves the job's requirements against the worker's Python and
installs the new wheels into a directory of their own (:mod:`.uv_commands` says what it is
asked), and the worker makes the result its own and read-only.

uv runs in the worker's job sandbox (the same bubblewrap view a job gets: the worker's Python
read-only, the service's directories hidden; the host's network only when wheels come from an
index), as ``ACE3_ENV_BUILD_UID`` when the worker is root (wheels are untrusted archives: they
are unpacked by a uid that can write nothing but the build's scratch directory), in a process
group of its own. Without bubblewrap (``ACE3_SANDBOX=uid``) it runs as that uid directly; a
worker that is not root, or runs jobs without a sandbox (``ACE3_SANDBOX=none``), builds as
itself. The build is killed past
``ACE3_ENV_BUILD_TIMEOUT_SECONDS`` and as soon as its tree grows past ``ACE3_ENV_MAX_BYTES``;
either way the message names the setting. uv's output goes to the job's log line by line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ace3_control.installed_packages import installed_packages
from ace3_control.settings import Settings
from ace3_worker.environments.uv_commands import (
    MAX_REPORT_BYTES,
    EnvironmentRefusedError,
    Pin,
    PreparationInterrupted,
    constraints_text,
    install_argv,
    parse_resolution,
    resolve_argv,
    uv_environment,
    uv_failure,
)
from ace3_worker.sandbox.bubblewrap import SandboxView, UidSwitch, bubblewrap_argv
from ace3_worker.sandbox.plan import SandboxPlan
from ace3_worker.sandbox.seccomp import filter_program

READ_ONLY_FILE = 0o444
READ_ONLY_DIR = 0o555
SIZE_POLL_SECONDS = 0.5
ERROR_TAIL_LINES = 40
INSIDE_INPUTS = PurePosixPath("/job")  # the build's read-only inputs, as the sandbox shows them
INSIDE_WORK = PurePosixPath("/build")  # its writable scratch


@dataclass(frozen=True)
class BuiltTree:
    """A finished build: the tree (the worker's, read-only), what it added, its size."""

    path: Path
    pins: tuple[Pin, ...]
    size_bytes: int
    seconds: float


def find_uv() -> str:
    """The uv binary of the worker's installation (the ``uv`` package's wheel ships it)."""
    import uv

    return str(uv.find_uv_bin())


def tree_bytes(path: Path) -> int:
    """The bytes of every file under ``path`` (links not followed)."""
    total = 0
    for directory, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def take_ownership(path: Path) -> None:
    """Make the tree the worker's and read-only (files 0444, directories 0555), never following
    a link; anything but a file, a directory or a link (a FIFO, a socket) is removed."""
    uid, gid = os.geteuid(), os.getegid()
    for directory, subdirectories, names in os.walk(path, topdown=False):
        for name in [*names, *subdirectories]:
            entry = os.path.join(directory, name)
            info = os.lstat(entry)
            kind = info.st_mode & 0o170000
            if kind not in (0o100000, 0o040000, 0o120000):  # (regular, directory, link)
                os.unlink(entry)
                continue
            os.chown(entry, uid, gid, follow_symlinks=False)
            if kind != 0o120000:
                os.chmod(entry, READ_ONLY_DIR if kind == 0o040000 else READ_ONLY_FILE)
    os.chown(path, uid, gid, follow_symlinks=False)
    os.chmod(path, READ_ONLY_DIR)


@dataclass
class _Step:
    returncode: int
    stdout: str
    stderr_tail: deque[str]


class EnvironmentBuilder:
    """Builds environments in scratch directories, in the worker's sandbox."""

    def __init__(
        self, settings: Settings, plan: SandboxPlan, log: Callable[[str], None] | None = None
    ) -> None:
        self.settings = settings
        self.plan = plan
        self.log = log or (lambda text: None)
        # Set by the attempt's keep-alive when the job is cancelled: uv is killed at once.
        self.interrupt = threading.Event()
        # (ACE3_SANDBOX=none: no isolation anywhere, the build runs as the worker like its jobs)
        unprivileged = os.geteuid() == 0 and plan.mode != "none"
        self.build_uid = settings.env_build_uid if unprivileged else None

    # -- where the build's files are, and how the command sees them -----------------------------
    def _inside(self, scratch: Path, path: Path) -> PurePosixPath:
        """Where the command sees ``path`` (under ``scratch/in`` or ``scratch/work``)."""
        if self.plan.mode != "bwrap":
            return PurePosixPath(path)
        relative = path.relative_to(scratch)
        top = INSIDE_INPUTS if relative.parts[0] == "in" else INSIDE_WORK
        return top.joinpath(*relative.parts[1:])

    def _prepare_scratch(self, scratch: Path) -> tuple[Path, Path]:
        """``scratch/in`` (read-only inputs: the constraints file) and ``scratch/work`` (the
        build uid's own, 0700)."""
        scratch.chmod(0o755)  # (the build uid passes through it without namespaces)
        inputs, work = scratch / "in", scratch / "work"
        inputs.mkdir(mode=0o755)
        (inputs / "constraints.txt").write_text(constraints_text(installed_packages()))
        (inputs / "constraints.txt").chmod(0o644)
        work.mkdir(mode=0o700)
        for name in ("home", "cache"):
            (work / name).mkdir(mode=0o700)
        if self.build_uid is not None:
            for path in (work, work / "home", work / "cache"):
                os.chown(path, self.build_uid, self.build_uid)
        return inputs, work

    def _runtime_paths(self) -> tuple[Path, ...]:
        """The worker's Python, uv, and a local wheelhouse (read-only in the sandbox)."""
        paths = list(self.plan.runtime_paths)
        uv_dir = Path(find_uv()).resolve().parent
        if not any(uv_dir == p or p in uv_dir.parents for p in paths):
            paths.append(uv_dir)
        links = self.settings.pip_find_links
        if links and "://" not in links and Path(links).is_dir():
            paths.append(Path(links).resolve())
        return tuple(paths)

    def _command(
        self, scratch: Path, argv: list[str], env: dict[str, str]
    ) -> tuple[list[str], dict[str, str], int | None]:
        """The command line that runs ``argv`` (sandboxed), its environment, a seccomp fd."""
        if self.plan.mode != "bwrap":
            return argv, env, None
        read_fd, write_fd = os.pipe()
        os.write(write_fd, filter_program())
        os.close(write_fd)
        view = SandboxView(
            job_root=scratch / "in",
            writable=((scratch / "work", INSIDE_WORK),),
            read_only_files=(),
            runtime_paths=self._runtime_paths(),
            hidden=self.plan.hidden,
            share_network=not self.settings.pip_offline,
            shm_bytes=64 << 20,
            env=env,
            switch=None if self.build_uid is None else UidSwitch(self.build_uid, self.build_uid),
        )
        return bubblewrap_argv(view, argv, seccomp_fd=read_fd, info_fd=None), {}, read_fd

    # -- running one step ---------------------------------------------------------------------
    def _run(
        self,
        scratch: Path,
        argv: list[str],
        env: dict[str, str],
        deadline: float,
        grows: Path | None = None,
    ) -> _Step:
        """Run one uv step to its end, its stderr to the log; killed (process group) past the
        deadline or once ``grows`` holds more than ``ACE3_ENV_MAX_BYTES``."""
        command, command_env, seccomp_fd = self._command(scratch, argv, env)
        as_uid = self.build_uid if self.plan.mode != "bwrap" else None  # (bwrap: setpriv)
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=command_env or env,
                cwd=scratch,
                start_new_session=True,
                pass_fds=() if seccomp_fd is None else (seccomp_fd,),
                user=as_uid,
                group=as_uid,
                extra_groups=None if as_uid is None else [],
            )
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        stdout: list[bytes] = []
        tail: deque[str] = deque(maxlen=ERROR_TAIL_LINES)
        assert process.stdout is not None and process.stderr is not None
        out_pipe, err_pipe = process.stdout, process.stderr

        def read_stdout() -> None:
            kept = 0
            for chunk in iter(lambda: out_pipe.read(65536), b""):
                if kept < MAX_REPORT_BYTES:
                    stdout.append(chunk)
                    kept += len(chunk)

        def read_stderr() -> None:
            for raw in err_pipe:
                line = raw.decode("utf-8", "replace").rstrip()
                if line:
                    tail.append(line)
                    self.log(f"uv: {line}")

        readers = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
        for reader in readers:
            reader.start()
        try:
            self._wait(process, deadline, grows)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            for reader in readers:
                reader.join(timeout=5)
        text = b"".join(stdout).decode("utf-8", "replace")
        return _Step(process.returncode, text, tail)

    def _wait(self, process: subprocess.Popen[bytes], deadline: float, grows: Path | None) -> None:
        while True:
            if self.interrupt.is_set():
                raise PreparationInterrupted("the environment's build was stopped")
            left = deadline - time.monotonic()
            if left <= 0:
                raise EnvironmentRefusedError(
                    "building the environment took longer than ACE3_ENV_BUILD_TIMEOUT_SECONDS "
                    f"({self.settings.env_build_timeout_seconds:g} s)"
                )
            try:
                process.wait(timeout=min(left, SIZE_POLL_SECONDS))
                return
            except subprocess.TimeoutExpired:
                pass
            if grows is not None and grows.exists():
                self._check_size(tree_bytes(grows))

    def _check_size(self, size: int) -> None:
        if size > self.settings.env_max_bytes:
            raise EnvironmentRefusedError(
                f"the environment is larger than ACE3_ENV_MAX_BYTES "
                f"({self.settings.env_max_bytes} bytes): {size} bytes or more"
            )

    # -- the build ----------------------------------------------------------------------------
    def build(self, requirements: Sequence[str], scratch: Path) -> BuiltTree:
        """Resolve and install ``requirements`` under the empty directory ``scratch``; the tree
        is ``scratch/work/target``. Raises :class:`EnvironmentRefusedError` naming what failed."""
        started = time.monotonic()
        deadline = started + self.settings.env_build_timeout_seconds
        inputs, work = self._prepare_scratch(scratch)
        uv, python = find_uv(), sys.executable
        env = uv_environment(
            self.settings,
            home=self._inside(scratch, work / "home"),
            cache=self._inside(scratch, work / "cache"),
        )
        constraints = self._inside(scratch, inputs / "constraints.txt")
        resolved = self._run(
            scratch, resolve_argv(uv, python, constraints, requirements, self.settings), env,
            deadline,
        )  # fmt: skip
        if resolved.returncode != 0:
            raise EnvironmentRefusedError(uv_failure(resolved.stderr_tail, resolved.returncode))
        pins = parse_resolution(resolved.stdout)
        target = work / "target"
        if pins:
            argv = install_argv(uv, python, self._inside(scratch, target), pins, self.settings)
            installed = self._run(scratch, argv, env, deadline, grows=target)
            if installed.returncode != 0:
                raise EnvironmentRefusedError(
                    uv_failure(installed.stderr_tail, installed.returncode)
                )
        target.mkdir(exist_ok=True)
        (target / ".lock").unlink(missing_ok=True)  # (uv's lock of the target, not a package)
        take_ownership(target)
        size = tree_bytes(target)
        self._check_size(size)
        return BuiltTree(target, tuple(pins), size, time.monotonic() - started)
