"""Warm sandboxes: each worker slot keeps one job sandbox started ahead of time.

A prepared sandbox is what a cold start builds once it has claimed a job, built before: a uid
leased, the attempt directory's skeleton (``etc/``, ``output/``, ``home/``, ``tmp/``:
:func:`ace3_worker.job_dir.make_skeleton`) under ``<work_dir>/.warm/``, and bubblewrap started
on it (:func:`ace3_worker.sandbox.launch.launch`, the same view, limits and allow-listed
environment) running a warm launcher (:mod:`ace3.runtime.process.warm_launcher`) that imports torch,
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
same, later). ``ACE3_WARM_LAUNCH=false`` keeps the cold path for every job.

The sandbox itself and the conversation with its launcher are
:mod:`ace3_worker.warm_sandbox`'s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ace3.runtime.process.warm_launcher import COMMAND as LAUNCHER
from ace3_control.settings import Settings
from ace3_worker.device import worker_device
from ace3_worker.drain import draining
from ace3_worker.held_dirs import lock_if_unheld, make_held_dir
from ace3_worker.job_dir import make_skeleton, traversable_dir
from ace3_worker.launch import LaunchSpec, RunningTorchrun, job_environment
from ace3_worker.sandbox.launch import launch
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.warm_sandbox import WarmSandbox, code_fingerprint, hidden_paths_present
from ace3_worker.workspace import Workspace, job_owner

logger = logging.getLogger(__name__)

WARM_DIR = ".warm"
# The longest a slot waits for its next launcher's imports before it takes another message.
READY_WAIT_SECONDS = 60.0
# The longest a slot waits for a preparation in flight (bubblewrap started, not its imports).
PREPARE_WAIT_SECONDS = 30.0


class WarmSlot:
    """The warm sandbox of one worker slot (a worker process). Sandboxes are prepared on a
    thread of the slot's own that lives as long as its process (bubblewrap's
    ``--die-with-parent`` follows the thread that started it), so preparing one never keeps
    the slot's main thread from its job or its next message."""

    def __init__(
        self,
        settings: Settings,
        workspace: Workspace,
        limits: JobLimits,
        pool: tuple[str, ...] | None,
        keeps_sandboxes: bool = True,
        slot: int = 0,
    ) -> None:
        """``pool``: the worker's device list (:func:`ace3_worker.device.device_pool`);
        ``keeps_sandboxes`` False: a slot of one job, which prepares none; ``slot``: which of
        the worker's slots (pool processes) this is."""
        self.settings = settings
        self.keeps_sandboxes = keeps_sandboxes
        self.workspace = workspace
        self.limits = limits
        self.prepared: WarmSandbox | None = None
        # A CUDA worker's sandbox binds the device nodes of the GPUs it is prepared for: at
        # first this slot's share of the pool, then the GPUs of the slot's last job.
        self.visible_devices = _share(pool, slot, settings.worker_slots) if pool else None
        self._why_none = "no sandbox was prepared yet (this slot's first job)"
        self._swept = False
        self._lock = threading.Lock()
        self._preparing: Future[None] | None = None
        self._preparer: ThreadPoolExecutor | None = None

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
        """Start preparing this slot's next sandbox (on the slot's preparing thread), unless
        one is prepared or being prepared, warm launch is off or the worker is draining. It
        never raises: a failure is logged, and the next job starts cold saying why. A slot holds
        two uids while a job runs (its job's and its next sandbox's); with none free, the next
        job leases one when it is claimed."""
        if not (self.settings.warm_launch and self.keeps_sandboxes):
            return
        if draining():
            self._why_none = "the worker is draining (it prepares no more sandboxes)"
            return
        if not sys.platform.startswith("linux"):  # (ranks forked from a launcher: Linux only)
            self._why_none = f"warm launchers need Linux (this is {sys.platform})"
            return
        with self._lock:
            if self.prepared is not None or self._preparing is not None:
                return
            if self._preparer is None:  # (one thread, never ended: see the class's docstring)
                self._preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ace3-warm")
            self._preparing = self._preparer.submit(self._prepare_now)

    def _prepare_now(self) -> None:
        sandbox = None
        try:
            sandbox = self._start()
        except Exception as exc:
            logger.exception("could not prepare a warm sandbox")
            self._why_none = f"preparing a sandbox failed ({exc})"
        with self._lock:
            self.prepared, self._preparing = sandbox, None

    def _settle(self) -> None:
        """Wait for a preparation in flight (it takes a fraction of a second)."""
        preparing = self._preparing
        if preparing is not None:
            with contextlib.suppress(TimeoutError):
                preparing.result(timeout=PREPARE_WAIT_SECONDS)

    def _start(self) -> WarmSandbox:
        identity = self.workspace.lease_identity()
        root: Path | None = None
        ours: socket.socket | None = None
        lock: int | None = None
        try:
            traversable_dir(self.settings.resolved_work_dir)
            traversable_dir(self.root)
            self._sweep()
            root, lock = make_held_dir(self.root, _skeleton_name, 0o750)
            directory = make_skeleton(
                root, job_owner(identity), self.workspace.plan.visible_root, made=True
            )
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
            hidden = hidden_paths_present(self.workspace.plan)
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
        except BaseException:
            if ours is not None:
                ours.close()
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)
            if lock is not None:
                os.close(lock)
            if identity is not None:
                identity.release()
            raise
        return WarmSandbox(process, ours, identity, directory, lock, env, fingerprint, hidden)

    def wait_until_ready(self) -> None:
        """Wait until the prepared sandbox's launcher has imported everything (at most
        READY_WAIT_SECONDS, and not while the worker drains). A slot calls it before it takes
        another message: a message then goes to a slot whose sandbox is ready, never waits for
        a launcher's imports while another slot has one ready (Celery hands a message to
        whichever idle slot it likes)."""
        self._settle()
        warm = self.prepared
        if warm is None or warm.wait_started() is not None:
            return
        deadline = time.monotonic() + READY_WAIT_SECONDS
        while warm.ready_now(wait=0.5) is None:
            if time.monotonic() > deadline or draining() or warm.process.poll() is not None:
                return

    def take(self) -> WarmSandbox | None:
        """The prepared sandbox for the next attempt (no longer the slot's), or None."""
        self._settle()
        with self._lock:
            warm, self.prepared = self.prepared, None
        return warm

    def skeleton_for(self, warm: WarmSandbox | None) -> Path | None:
        """The directory the attempt's is made of: ``warm``'s, once its launcher runs (its
        bind mounts are made then, so the directory may be moved); None when there is no warm
        sandbox, or it will not run the attempt (then it is discarded, keeping its uid for the
        attempt, and :meth:`start` says why)."""
        if warm is None:
            return None
        warm.problem = self._unusable(warm) or warm.wait_started()
        if warm.problem is not None:
            self.discard(warm, keep_identity=True)
            return None
        return warm.directory.root

    def keep(self, warm: WarmSandbox) -> None:
        """The message found no job to run: the sandbox waits for the next one."""
        with self._lock:
            self.prepared = warm

    def discard(self, warm: WarmSandbox, *, keep_identity: bool = False) -> None:
        """Done with a sandbox: stopped (:meth:`WarmSandbox.stop`), its skeleton removed unless
        an attempt's directory was made of it (moved away), its uid released unless an attempt
        runs on it. Idempotent."""
        if warm.stopped:
            return
        warm.stop()
        shutil.rmtree(warm.directory.root, ignore_errors=True)  # (gone when it was moved)
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
            try:
                running = warm.hand(self.settings, spec.warm_args, env)
            except OSError as exc:  # (it died since it was checked)
                reason = f"the prepared launcher could not take the job ({exc})"
            else:
                state = (
                    f"its launcher imported torch and the engine in {ready.seconds:.1f} s"
                    if ready is not None
                    else "its launcher is still importing torch and the engine"
                )
                return running, (
                    f"ace3: warm start: a sandbox prepared {waited:.1f} s before runs this "
                    f"attempt ({state})"
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
        return self._unusable(warm)

    def _unusable(self, warm: WarmSandbox) -> str | None:
        return warm.unusable(code_fingerprint(), hidden_paths_present(self.workspace.plan))

    def _sweep(self) -> None:
        """Remove the skeletons of warm sandboxes whose worker process is gone (once): each
        live one is locked by the process that prepared it (workers sharing the directory
        included)."""
        if self._swept:
            return
        self._swept = True
        for entry in self.root.iterdir():
            lock = lock_if_unheld(entry)
            if lock is None:
                continue  # (locked: a live sandbox's, or one being made)
            try:
                shutil.rmtree(entry, ignore_errors=True)
            finally:
                os.close(lock)


def _skeleton_name() -> str:
    return f"{os.getpid()}-{secrets.token_hex(6)}"


def _share(pool: tuple[str, ...], slot: int, slots: int) -> str:
    """Slot ``slot``'s share of the worker's GPUs (all of them for one slot)."""
    size = max(1, len(pool) // max(1, slots))
    first = (slot * size) % len(pool)
    devices = pool[first : first + size]
    return ",".join(devices if len(devices) == size else pool[:size])
