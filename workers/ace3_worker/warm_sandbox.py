"""One warm sandbox: a job sandbox started before its job was known, whose launcher
(:mod:`ace3.runtime.process.warm_launcher`) waits for that job on a control socket.

What the slot does with it (prepare, take, hand a job, or the cold path) is
:mod:`ace3_worker.warm`'s. This module holds the sandbox's state and the worker's end of the
conversation (:mod:`ace3.config.warm_launch`): the launcher's ``started`` and ``ready`` lines,
then one job line; the worker reads nothing after the job line and keeps its end open until
the attempt ends (so a ``ready`` the launcher writes after the job was handed never fails).
Everything the launcher writes is validated and bounded, and only decides whether the sandbox
is used, never what the worker does with a file or a process.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import select
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import ace3
from ace3.config.warm_launch import (
    LauncherReady,
    WarmJob,
    parse_ready,
    parse_started,
    read_line,
    send_message,
)
from ace3_control.settings import Settings
from ace3_worker.job_dir import JobDirectory
from ace3_worker.launch import RunningTorchrun, follow_output
from ace3_worker.sandbox.identity import JobIdentity
from ace3_worker.sandbox.launch import SandboxedProcess
from ace3_worker.sandbox.plan import SandboxPlan

# A launcher that has not started this long after bubblewrap was is broken (it takes a second).
STARTED_TIMEOUT_SECONDS = 10.0
# What the worker's log keeps of a launcher that died before its job.
STDERR_TAIL_BYTES = 4096


def code_fingerprint() -> str:
    """The engine's and torch's code as it is on disk now (each file's path, size and mtime):
    a launcher started before it changed would run older code than a cold start."""
    digest = hashlib.sha256()
    files = sorted(Path(ace3.__file__).parent.rglob("*.py"))
    torch = importlib.util.find_spec("torch")
    if torch is not None and torch.origin is not None:
        files += [Path(torch.origin), Path(torch.origin).with_name("version.py")]
    for path in files:
        try:
            info = path.stat()
        except OSError:
            continue
        digest.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def hidden_paths_present(plan: SandboxPlan) -> frozenset[Path]:
    """The service's paths that a sandbox started now would cover (those under a directory it
    binds) and that exist: bubblewrap hides only what exists when it starts."""
    bound = [Path(path) for path in plan.runtime_paths]
    return frozenset(
        path
        for path in plan.hidden
        if any(path == top or top in path.parents for top in bound) and path.exists()
    )


@dataclass
class WarmSandbox:
    """A sandbox started ahead of time, waiting for its job."""

    process: SandboxedProcess
    control: socket.socket  # (kept open until the attempt ends: the launcher may still write)
    identity: JobIdentity | None
    directory: JobDirectory  # its skeleton, until the attempt's directory is made of it
    directory_lock: int  # an flock on the skeleton: held, it is not a dead worker's
    env: dict[str, str]  # its environment at start
    fingerprint: str
    hidden: frozenset[Path]  # what its view hides (hidden_paths_present at its start)
    started_at: float = field(default_factory=time.monotonic)
    running: bool = False  # its launcher said it runs: the sandbox's mounts are made
    ready: LauncherReady | None = None
    handed: bool = False  # its launcher runs the attempt's torchrun now
    stopped: bool = False
    problem: str | None = None  # why it did not run the attempt it was taken for

    def unusable(self, fingerprint: str, hidden: frozenset[Path]) -> str | None:
        """Why it cannot take a job now (None: it can)."""
        if self.process.poll() is not None:
            return f"the prepared launcher exited (status {self.process.returncode}) before its job"
        if fingerprint != self.fingerprint:
            return "the worker's code changed on disk after the prepared launcher started"
        if appeared := sorted(hidden - self.hidden):
            return (
                f"a service path appeared after the prepared sandbox started ({appeared[0]}): "
                "only a sandbox started now hides it"
            )
        return None

    def wait_started(self) -> str | None:
        """Wait until the launcher runs (its sandbox is set up, so its directory may be moved),
        at most until STARTED_TIMEOUT_SECONDS after it was started; why it does not, or None."""
        if self.running:
            return None
        left = STARTED_TIMEOUT_SECONDS - (time.monotonic() - self.started_at)
        try:
            self.control.settimeout(max(left, 0.001))
            line = read_line(self.control)
            if not line:
                return f"the prepared launcher exited ({self._stderr_tail()})"
            parse_started(line)
        except TimeoutError:
            return f"the prepared launcher did not start within {STARTED_TIMEOUT_SECONDS:g} s"
        except (OSError, ValueError) as exc:
            return f"the prepared launcher's first message could not be read ({exc})"
        self.running = True
        return None

    def ready_now(self, wait: float = 0.0) -> LauncherReady | None:
        """Whether the launcher has said it is ready (it imported everything), waiting at most
        ``wait`` seconds (a job handed before that waits in its socket until it is)."""
        if self.ready is None and self.running:
            with contextlib.suppress(OSError, ValueError):
                ready, _, _ = select.select([self.control], [], [], wait)
                self.control.settimeout(0)
                if ready and b"\n" in self.control.recv(65536, socket.MSG_PEEK):  # (whole lines)
                    self.ready = parse_ready(read_line(self.control))
        return self.ready

    def hand(self, settings: Settings, argv: list[str], env: dict[str, str]) -> RunningTorchrun:
        """Give the launcher its job and follow its output: it is the attempt's torchrun now."""
        self.control.settimeout(10.0)
        send_message(self.control, WarmJob(argv=argv, env=env))
        self.handed = True
        return follow_output(settings, self.process)

    def _stderr_tail(self) -> str:
        """What a launcher that exited before its job wrote last (it wrote nothing else)."""
        stream = self.process.process.stderr
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5.0)  # (it closed the socket: it is leaving)
        if self.process.poll() is None or stream is None:
            return "no exit status yet"
        readable, _, _ = select.select([stream], [], [], 1.0)  # (all of it is in the pipe)
        text = os.read(stream.fileno(), 1 << 16)[-STDERR_TAIL_BYTES:] if readable else b""
        said = text.decode("utf-8", "replace").strip() or "no output"
        return f"status {self.process.returncode}: {said}"

    def stop(self) -> None:
        """Close the control socket and the directory's lock and, unless it runs the attempt's
        torchrun (which the attempt stops), kill the launcher and everything of its sandbox
        (not its directory, nor its uid). Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        self.control.close()
        os.close(self.directory_lock)
        if self.handed:
            return
        self.process.kill()
        self.process.wait()
        self.process.close()
        for stream in (self.process.process.stdout, self.process.process.stderr):
            if stream is not None:
                stream.close()
