"""Building an environment: uv resolves the job's requirements against the worker's Python and
installs the new wheels into a directory of their own (:mod:`.uv_commands` says what it is
asked), and the worker makes the result its own and read-only (:mod:`.tree`).

uv runs in the worker's job sandbox (the same bubblewrap view a job gets: the worker's Python
read-only, the service's directories hidden; the host's network only when wheels come from an
index), as ``ACE3_ENV_BUILD_UID`` when the worker is root (wheels are untrusted archives: they
are unpacked by a uid that can write nothing but the build's scratch directory), in a process
group of its own. The index settings, which may hold credentials, reach uv through bubblewrap's
``--args`` pipe, never a command line. Without bubblewrap (``ACE3_SANDBOX=uid``) uv runs as that
uid directly, and never builds from source there (a package's build would run its code as that
uid with no namespace to end it); a worker that is not root, or runs jobs without a sandbox
(``ACE3_SANDBOX=none``), builds as itself. The build is killed past
``ACE3_ENV_BUILD_TIMEOUT_SECONDS`` and as soon as its disk use passes the limits of
:mod:`.build_limits`; either way the message names the setting. A failure that may pass (the
index unreachable, the disk full) raises :class:`EnvironmentBuildError`, one that would fail
again :class:`EnvironmentRefusedError` (:func:`.uv_commands.uv_error`). uv's output goes to the
job's log line by line.
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
from ace3_worker.environments.build_limits import (
    POLL_SECONDS,
    DiskWatch,
    check_tree,
    rlimit_prefix,
    wait_gone,
)
from ace3_worker.environments.tree import measure
from ace3_worker.environments.tree import take_ownership as take_ownership
from ace3_worker.environments.uv_commands import (
    MAX_REPORT_BYTES,
    SECRET_VARIABLES,
    EnvironmentRefusedError,
    Pin,
    PreparationInterrupted,
    constraints_text,
    install_argv,
    parse_resolution,
    resolve_argv,
    uv_environment,
    uv_error,
)
from ace3_worker.reports import MAX_LINE_CHARS
from ace3_worker.sandbox.bubblewrap import (
    SandboxView,
    UidSwitch,
    bubblewrap_argv,
    secret_arguments,
)
from ace3_worker.sandbox.plan import SandboxPlan
from ace3_worker.sandbox.seccomp import filter_program

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
    ) -> tuple[list[str], dict[str, str], tuple[int, ...]]:
        """The command line that runs ``argv`` (sandboxed, under ``RLIMIT_FSIZE``), the
        environment to start it with, the pipes it reads (seccomp filter, secret variables)."""
        limits = rlimit_prefix(self.settings.env_max_bytes)
        if self.plan.mode != "bwrap":
            return limits + argv, env, ()
        public = {k: v for k, v in env.items() if k not in SECRET_VARIABLES}
        view = SandboxView(
            job_root=scratch / "in",
            writable=((scratch / "work", INSIDE_WORK),),
            read_only_files=(),
            runtime_paths=self._runtime_paths(),
            hidden=self.plan.hidden,
            share_network=not self.settings.pip_offline,
            shm_bytes=64 << 20,
            env=public,
            switch=None if self.build_uid is None else UidSwitch(self.build_uid, self.build_uid),
            secret_env={k: v for k, v in env.items() if k in SECRET_VARIABLES},
        )
        secrets = secret_arguments(view) if view.secret_env else None
        seccomp_fd = _pipe_holding(filter_program())
        args_fd = None if secrets is None else _pipe_holding(secrets)
        command = bubblewrap_argv(view, argv, seccomp_fd=seccomp_fd, info_fd=None, args_fd=args_fd)
        # (bubblewrap starts with an environment of its own that holds no secret: --clearenv)
        fds = (seccomp_fd,) if args_fd is None else (seccomp_fd, args_fd)
        return limits + command, {"PATH": public["PATH"]}, fds

    # -- running one step ---------------------------------------------------------------------
    def _run(self, scratch: Path, argv: list[str], env: dict[str, str], deadline: float) -> _Step:
        """Run one uv step to its end, its stderr to the log; killed (process group) past the
        deadline or once the build's disk use passes the limits (:class:`DiskWatch`); nothing
        of it runs any more when it returns."""
        command, command_env, fds = self._command(scratch, argv, env)
        as_uid = self.build_uid if self.plan.mode != "bwrap" else None  # (bwrap: setpriv)
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=command_env,
                cwd=scratch,
                start_new_session=True,
                pass_fds=fds,
                user=as_uid,
                group=as_uid,
                extra_groups=None if as_uid is None else [],
            )
        finally:
            for fd in fds:
                os.close(fd)
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
            # (a line is read at most MAX_LINE_CHARS bytes at a time: a build backend that uv
            # relays, ACE3_PIP_ALLOW_SOURCE_BUILDS, could write one line without end)
            for raw in iter(lambda: err_pipe.readline(MAX_LINE_CHARS), b""):
                line = raw.decode("utf-8", "replace").rstrip()
                if line:
                    tail.append(line)
                    self.log(f"uv: {line}")

        readers = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
        for reader in readers:
            reader.start()
        work = scratch / "work"
        try:
            self._wait(process, deadline, DiskWatch(work, work / "target", self._max_bytes))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            wait_gone(process.pid)
            for reader in readers:
                reader.join(timeout=5)
        text = b"".join(stdout).decode("utf-8", "replace")
        return _Step(process.returncode, text, tail)

    @property
    def _max_bytes(self) -> int:
        return self.settings.env_max_bytes

    def _wait(self, process: subprocess.Popen[bytes], deadline: float, watch: DiskWatch) -> None:
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
                process.wait(timeout=min(left, POLL_SECONDS))
                return
            except subprocess.TimeoutExpired:
                pass
            if watch.due():
                watch.check()

    # -- the build ----------------------------------------------------------------------------
    def _uv_settings(self) -> Settings:
        """The settings uv's command lines follow: never a source build as the build uid
        without bubblewrap (a package's build code would run with no namespace around it, and
        could leave a process of the build uid running past the build)."""
        if self.plan.mode == "bwrap" or self.build_uid is None:
            return self.settings
        if self.settings.pip_allow_source_builds:
            self.log(
                "ace3: ACE3_PIP_ALLOW_SOURCE_BUILDS is ignored with ACE3_SANDBOX=uid: wheels only"
            )
        return self.settings.model_copy(update={"pip_allow_source_builds": False})

    def _step(self, scratch: Path, argv: list[str], env: dict[str, str], deadline: float) -> _Step:
        step = self._run(scratch, argv, env, deadline)
        if step.returncode != 0:
            raise uv_error(step.stderr_tail, step.returncode, self._max_bytes)
        return step

    def build(self, requirements: Sequence[str], scratch: Path) -> BuiltTree:
        """Resolve and install ``requirements`` under the empty directory ``scratch``; the tree
        is ``scratch/work/target``. Raises :class:`EnvironmentRefusedError` (it would fail
        again) or :class:`EnvironmentBuildError` (it may pass), naming what failed."""
        started = time.monotonic()
        deadline = started + self.settings.env_build_timeout_seconds
        inputs, work = self._prepare_scratch(scratch)
        uv, python, settings = find_uv(), sys.executable, self._uv_settings()
        env = uv_environment(
            settings,
            home=self._inside(scratch, work / "home"),
            cache=self._inside(scratch, work / "cache"),
        )
        constraints = self._inside(scratch, inputs / "constraints.txt")
        resolve = resolve_argv(uv, python, constraints, requirements, settings)
        pins = parse_resolution(self._step(scratch, resolve, env, deadline).stdout)
        target = work / "target"
        if pins:
            argv = install_argv(uv, python, self._inside(scratch, target), pins, settings)
            self._step(scratch, argv, env, deadline)
        target.mkdir(exist_ok=True)
        (target / ".lock").unlink(missing_ok=True)  # (uv's lock of the target, not a package)
        take_ownership(target)
        usage = measure(target)
        check_tree(usage.bytes, usage.entries, self._max_bytes)
        return BuiltTree(target, tuple(pins), usage.bytes, time.monotonic() - started)


def _pipe_holding(data: bytes) -> int:
    """The read end of a pipe that holds ``data`` and is closed for writing (a pipe holds 64
    KiB: the seccomp filter and the secret variables are far smaller)."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, data)
    finally:
        os.close(write_fd)
    return read_fd
