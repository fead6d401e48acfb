"""Starting an attempt's torchrun in the worker's sandbox and reading its output.

The command (single-node ``--standalone`` or a node of a c10d rendezvous) comes from the
attempt's membership (:mod:`ace3_worker.membership`); this module starts it with the sandboxed,
allow-listed environment (:mod:`ace3_worker.sandbox.launch`) and pumps its stdout and stderr
into a queue through the log limiter (:mod:`ace3_worker.log_limits`). Stopping kills the whole
sandbox: no process of the attempt outlives it.
"""

from __future__ import annotations

import os
import queue
import select
import threading
from dataclasses import dataclass, field
from typing import IO

from ace3_control.settings import Settings
from ace3_worker import reports
from ace3_worker.job_dir import JobDirectory
from ace3_worker.launcher import rank_environment
from ace3_worker.log_limits import LogLimiter
from ace3_worker.sandbox.identity import JobIdentity
from ace3_worker.sandbox.launch import SandboxedProcess, launch, sandbox_environment
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.sandbox.plan import SandboxPlan
from ace3_worker.workspace import job_owner

# Lines read but not yet stored (the database may be down): past it, lines are dropped.
MAX_QUEUED_LINES = 50_000
PUMP_JOIN_SECONDS = 10


@dataclass(frozen=True)
class LaunchSpec:
    """What one node runs: torchrun's command line, and what the sandbox adds for it."""

    command: list[str]
    share_network: bool = False  # a multi-node rendezvous crosses machines
    env: dict[str, str] = field(default_factory=dict)
    # torchrun's arguments for a warm launcher (:mod:`ace3_worker.warm`); None: this node
    # cannot run in a sandbox prepared ahead of time (its network is fixed when it starts).
    warm_args: list[str] | None = None


@dataclass
class RunningTorchrun:
    """A started torchrun and the threads that read its output into ``lines``; ``activity`` is
    set when a line is queued, when an output stream ends and when torchrun exits (what wakes
    the watch loop: :mod:`ace3_worker.watch`)."""

    process: SandboxedProcess
    lines: queue.Queue[reports.LogLine]
    limiter: LogLimiter
    pumps: list[threading.Thread]
    activity: threading.Event

    def stop(self) -> int:
        """Kill whatever is left of the sandbox, wait for it and for the pumps; its exit
        status."""
        self.process.kill()
        self.process.wait()
        self.process.close()
        for pump in self.pumps:
            pump.join(timeout=PUMP_JOIN_SECONDS)
        returncode = self.process.returncode
        assert returncode is not None
        return returncode


def job_environment(
    settings: Settings,
    directory: JobDirectory,
    identity: JobIdentity | None,
    *,
    device: str,
    job_id: str | None,
    nproc: int,
    visible_devices: str | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The ranks' whole environment; ``visible_devices`` (the attempt's own devices,
    :mod:`ace3_worker.gpu_sets`) becomes their ``CUDA_VISIBLE_DEVICES``, which also chooses the
    GPU device nodes the sandbox binds. ``job_id`` None: a warm sandbox's, before its job."""
    env = sandbox_environment(
        rank_environment(device, nproc, settings.worker_slots),
        directory,
        job_owner(identity),
        job_id,
    )
    env.update(extra or {})
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    return env


def start_torchrun(
    settings: Settings,
    plan: SandboxPlan,
    limits: JobLimits,
    spec: LaunchSpec,
    env: dict[str, str],
    *,
    directory: JobDirectory,
    identity: JobIdentity | None,
    device: str,
) -> RunningTorchrun:
    """Start the node's torchrun in a new sandbox (the cold path), with the ranks' whole
    environment ``env`` (:func:`job_environment`)."""
    process = launch(
        plan,
        directory,
        identity,
        spec.command,
        env,
        share_network=spec.share_network,
        device=device,
        limits=limits,
    )
    return follow_output(settings, process)


def follow_output(settings: Settings, process: SandboxedProcess) -> RunningTorchrun:
    """Read the started torchrun's stdout and stderr into a queue, through the log limiter."""
    limiter = LogLimiter(
        settings.max_log_lines_per_second,
        settings.max_log_bytes_per_second,
        settings.max_log_bytes_per_job,
    )
    lines: queue.Queue[reports.LogLine] = queue.Queue()
    activity = threading.Event()
    pumps = [
        threading.Thread(
            target=_pump,
            args=(stream, name, lines, limiter, activity),
            daemon=True,
            name=f"ace3-{name}",
        )
        for stream, name in (
            (process.process.stdout, "stdout"),
            (process.process.stderr, "stderr"),
        )
    ]
    for pump in pumps:
        pump.start()
    threading.Thread(
        target=_wake_at_exit, args=(process, activity), daemon=True, name="ace3-exit"
    ).start()
    return RunningTorchrun(process, lines, limiter, pumps, activity)


def _wake_at_exit(process: SandboxedProcess, activity: threading.Event) -> None:
    """Set ``activity`` once torchrun's sandbox has exited, without reaping it: the watch loop
    does, so its PID is never freed while another thread might still signal it."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (OSError, AttributeError):  # (reaped already, or no pidfds: the loop's next pass)
        return
    try:
        select.select([pidfd], [], [])  # (readable once the process has exited)
    finally:
        os.close(pidfd)
    activity.set()


def _pump(
    stream: IO[bytes],
    name: str,
    lines: queue.Queue[reports.LogLine],
    limiter: LogLimiter,
    activity: threading.Event,
) -> None:
    """Read one of torchrun's streams line by line (a line is cut at MAX_LINE_CHARS bytes and
    its rest skipped), queueing what the limiter admits."""
    limit = reports.MAX_LINE_CHARS
    skipping = False  # the rest of a line already cut
    for raw in iter(lambda: stream.readline(limit), b""):
        complete = raw.endswith(b"\n")
        if skipping:
            skipping = not complete
            continue
        skipping = not complete and len(raw) >= limit
        if lines.qsize() >= MAX_QUEUED_LINES:
            limiter.drop("the database is not keeping up with the job's log")
        elif limiter.admit(len(raw)):
            lines.put(reports.parse_log_line(name, raw.decode("utf-8", errors="replace")))
            activity.set()
    stream.close()
    activity.set()
