"""Warm sandboxes: each worker slot keeps one job sandbox started ahead of time.

A prepared sandbox is what a cold start builds once it has claimed a job, built before: a uid
leased, the attempt directory's skeleton (``etc/``, ``output/``, ``home/``, ``tmp/``:
:func:`ace3_worker.job_dir.make_skeleton`) under ``<work_dir>/.warm/``, and bubblewrap started
on it (:func:`ace3_worker.sandbox.launch.launch`, the same view, limits and allow-listed
environment) running a warm launcher (:mod:`ace3.runtime.warm_launcher`) that imports torch,
torchrun's agent and the engine, and no user code. When the slot claims a job, the skeleton is
moved to the attempt's path (the sandbox's bind mount follows the directory), the job's inputs
are copied into it as on the cold path, and the launcher gets torchrun's arguments and the job's
whole environment over its control socket; its ranks are forks of it. From there on it is the
attempt's torchrun like any other (:class:`ace3_worker.launch.RunningTorchrun`): watched,
stopped and killed the same way. A sandbox serves one job; the slot prepares the next one as
soon as its job has started, so back-to-back jobs find one ready.

A job the prepared sandbox cannot fit takes the cold path on the same directory and uid, and
the job's log says which path it took and why: a multi-node job (its nodes meet over the
host's network), a CUDA job whose GPUs are not the ones the sandbox binds, a launcher that
exited, did not start in time, or started before the worker's code changed on disk. A job may
be handed to a launcher still importing: it waits in the socket (a cold start would import the
same, later).
``ACE3_WARM_LAUNCH=false`` keeps the cold path for every job.

The control socket is one end of a socket pair passed to the launcher: the worker reads one
readiness line from it and writes one job line; the launcher closes its end before anything of
the job runs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import logging
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
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
from ace3.runtime.warm_launcher import COMMAND as LAUNCHER
from ace3_control.settings import Settings
from ace3_worker.device import worker_device
from ace3_worker.drain import draining
from ace3_worker.job_dir import JobDirectory, make_skeleton, traversable_dir
from ace3_worker.launch import LaunchSpec, RunningTorchrun, follow_output, job_environment
from ace3_worker.sandbox.identity import JobIdentity, NoFreeIdentityError
from ace3_worker.sandbox.launch import SandboxedProcess, launch
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.workspace import Workspace, job_owner

logger = logging.getLogger(__name__)

WARM_DIR = ".warm"
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


@dataclass
class WarmSandbox:
    """A sandbox started ahead of time, waiting for its job."""

    process: SandboxedProcess
    control: socket.socket  # (kept open until the attempt ends: the launcher may still write)
    identity: JobIdentity | None
    directory: JobDirectory  # its skeleton, until the attempt's directory is made of it
    env: dict[str, str]  # its environment at start
    fingerprint: str
    started_at: float = field(default_factory=time.monotonic)
    running: bool = False  # its launcher said it runs: the sandbox's mounts are made
    ready: LauncherReady | None = None
    moved: bool = False  # the attempt's directory was made of its skeleton
    handed: bool = False  # its launcher runs the attempt's torchrun now
    stopped: bool = False
    problem: str | None = None  # why it did not run the attempt it was taken for

    def unusable(self, fingerprint: str) -> str | None:
        """Why it cannot take a job now (None: it can)."""
        if self.process.poll() is not None:
            return f"the prepared launcher exited (status {self.process.returncode}) before its job"
        if fingerprint != self.fingerprint:
            return "the worker's code changed on disk after the prepared launcher started"
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

    def ready_now(self) -> LauncherReady | None:
        """Whether the launcher has said it is ready (it imported everything), without waiting:
        a job handed before that waits in its socket until the imports are done."""
        if self.ready is None and self.running:
            with contextlib.suppress(OSError, ValueError):
                self.control.settimeout(0)
                line = read_line(self.control)
                self.ready = parse_ready(line) if line else None
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
        text = stream.read()[-STDERR_TAIL_BYTES:].decode("utf-8", "replace").strip()
        return f"status {self.process.returncode}: {text or 'no output'}"

    def stop(self) -> None:
        """Close the control socket and, unless it runs the attempt's torchrun (which the
        attempt stops), kill the launcher and everything of its sandbox (not its directory,
        nor its uid). Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        self.control.close()
        if self.handed:
            return
        self.process.kill()
        self.process.wait()
        self.process.close()
        for stream in (self.process.process.stdout, self.process.process.stderr):
            if stream is not None:
                stream.close()


class WarmSlot:
    """The warm sandbox of one worker slot (a worker process), prepared from its main thread:
    bubblewrap's ``--die-with-parent`` follows the thread that started it."""

    def __init__(
        self,
        settings: Settings,
        workspace: Workspace,
        limits: JobLimits,
        pool: tuple[str, ...] | None,
        keeps_sandboxes: bool = True,
    ) -> None:
        """``pool``: the worker's device list (:func:`ace3_worker.device.device_pool`);
        ``keeps_sandboxes`` False: a slot of one job, which prepares none."""
        self.settings = settings
        self.keeps_sandboxes = keeps_sandboxes
        self.workspace = workspace
        self.limits = limits
        self.prepared: WarmSandbox | None = None
        # A CUDA worker's sandbox binds the device nodes of the GPUs it is prepared for: at
        # first a slot's share of the pool, then the GPUs of the slot's last job.
        self.visible_devices = (
            ",".join(pool[: max(1, len(pool) // settings.worker_slots)]) if pool else None
        )
        self._why_none = "no sandbox was prepared yet (this slot's first job)"
        self._swept = False

    @functools.cached_property
    def device(self) -> str:
        return worker_device(self.settings.worker_device)

    def preferred_devices(self, warm: WarmSandbox | None) -> tuple[str, ...]:
        """The GPUs a job should get to run in ``warm`` (a CUDA worker's; else none)."""
        if warm is None or self.device != "cuda":
            return ()
        return tuple(d for d in warm.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d)

    @property
    def root(self) -> Path:
        return self.settings.resolved_work_dir / WARM_DIR

    def prepare(self) -> None:
        """Start this slot's next sandbox, unless one is prepared, warm launch is off or the
        worker is draining; a failure is logged (the next job then starts cold)."""
        if self.prepared is not None or not (self.settings.warm_launch and self.keeps_sandboxes):
            return
        if draining():
            self._why_none = "the worker is draining (it prepares no more sandboxes)"
            return
        try:
            identity = self.workspace.lease_identity()
        except NoFreeIdentityError as exc:
            self._why_none = f"no uid was free for a prepared sandbox ({exc})"
            return
        root = self.root / f"{os.getpid()}-{secrets.token_hex(6)}"
        ours: socket.socket | None = None
        try:
            traversable_dir(self.settings.resolved_work_dir)
            traversable_dir(self.root)
            self._sweep()
            directory = make_skeleton(root, job_owner(identity), self.workspace.plan.visible_root)
            ours, theirs = socket.socketpair()
            env = job_environment(
                self.settings,
                directory,
                identity,
                device=self.device,
                job_id=None,
                nproc=1,
                visible_devices=self.visible_devices,
            )
            fingerprint = code_fingerprint()
            with theirs:
                process = launch(
                    self.workspace.plan,
                    directory,
                    identity,
                    [*LAUNCHER, "--control-fd", str(theirs.fileno())],
                    env,
                    share_network=False,
                    device=self.device,
                    limits=self.limits,
                    inherited_fds=(theirs.fileno(),),
                )
        except Exception as exc:
            logger.exception("could not prepare a warm sandbox")
            self._why_none = f"preparing a sandbox failed ({exc})"
            if ours is not None:
                ours.close()
            shutil.rmtree(root, ignore_errors=True)
            if identity is not None:
                identity.release()
            return
        self.prepared = WarmSandbox(process, ours, identity, directory, env, fingerprint)

    def take(self) -> WarmSandbox | None:
        """The prepared sandbox for the next attempt (no longer the slot's), or None."""
        warm, self.prepared = self.prepared, None
        return warm

    def skeleton_for(self, warm: WarmSandbox | None) -> Path | None:
        """The directory the attempt's is made of: ``warm``'s, once its launcher runs (its
        bind mounts are made then, so the directory may be moved); None when there is no warm
        sandbox, or it will not run the attempt (then it is discarded, keeping its uid for the
        attempt, and :meth:`start` says why)."""
        if warm is None:
            return None
        warm.problem = warm.unusable(code_fingerprint()) or warm.wait_started()
        if warm.problem is not None:
            self.discard(warm, keep_identity=True)
            return None
        warm.moved = True
        return warm.directory.root

    def keep(self, warm: WarmSandbox) -> None:
        """The message found no job to run: the sandbox waits for the next one."""
        self.prepared = warm

    def discard(self, warm: WarmSandbox, *, keep_identity: bool = False) -> None:
        """Done with a sandbox: stopped (:meth:`WarmSandbox.stop`), its directory removed unless
        an attempt was made of it, its uid released unless an attempt runs on it (idempotent)."""
        if warm.stopped:
            return
        warm.stop()
        if not warm.moved:
            shutil.rmtree(warm.directory.root, ignore_errors=True)
        if not keep_identity and warm.identity is not None:
            warm.identity.release()

    def start(
        self,
        warm: WarmSandbox | None,
        spec: LaunchSpec,
        env: dict[str, str],
        cold: Callable[[], RunningTorchrun],
    ) -> tuple[RunningTorchrun, str]:
        """The attempt's torchrun: handed to ``warm`` when it can take it, else ``cold()``;
        and the job log's line saying which path it took and why."""
        reason = self._cold_reason(warm, spec, env)
        if warm is not None and reason is None:
            assert spec.warm_args is not None
            ready = warm.ready_now()
            waited = time.monotonic() - warm.started_at
            running = warm.hand(self.settings, spec.warm_args, env)
            state = (
                f"its launcher imported torch and the engine in {ready.seconds:.1f} s"
                if ready is not None
                else "its launcher is still importing torch and the engine"
            )
            return running, (
                f"ace3: warm start: a sandbox prepared {waited:.1f} s before runs this attempt "
                f"({state})"
            )
        if warm is not None:
            self.discard(warm, keep_identity=True)
        return cold(), f"ace3: cold start: {reason}"

    def _cold_reason(
        self, warm: WarmSandbox | None, spec: LaunchSpec, env: dict[str, str]
    ) -> str | None:
        if not self.settings.warm_launch:
            return "warm launch is off (ACE3_WARM_LAUNCH=false)"
        if not self.keeps_sandboxes:
            return "this supervisor runs one job and keeps no sandbox prepared"
        if spec.warm_args is None:
            return (
                "a multi-node job's nodes meet over the host's network, and a prepared "
                "sandbox has a network of its own"
            )
        if warm is None:
            return self._why_none
        if warm.problem is not None:
            return warm.problem
        if self.device == "cuda" and env.get("CUDA_VISIBLE_DEVICES") != warm.env.get(
            "CUDA_VISIBLE_DEVICES"
        ):
            return (
                f"its GPUs ({env.get('CUDA_VISIBLE_DEVICES')}) are not the ones the prepared "
                f"sandbox binds ({warm.env.get('CUDA_VISIBLE_DEVICES')})"
            )
        return warm.unusable(code_fingerprint())

    def _sweep(self) -> None:
        """Remove the directories of warm sandboxes whose worker process is gone (once)."""
        if self._swept:
            return
        self._swept = True
        if not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            pid = entry.name.partition("-")[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):
                    shutil.rmtree(entry)
