"""One attempt run the way a worker runs it, without the database and the queue: the worker's
device list (``ACE3_WORKER_GPUS``) hands the attempt its devices (:mod:`ace3_worker.gpu_sets`),
its skeleton directory, job uid and environment are the worker's (:mod:`ace3_worker.job_dir`,
:mod:`ace3_worker.launch`), and the command runs in the worker's bubblewrap sandbox, which
binds the device nodes of those GPUs alone. Every line the attempt prints comes back."""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ace3_control.settings import Settings
from ace3_worker.device import device_pool
from ace3_worker.gpu_sets import DeviceAllocator
from ace3_worker.job_dir import JobDirectory, make_skeleton, traversable_dir
from ace3_worker.launch import LaunchSpec, job_environment, start_torchrun
from ace3_worker.launcher import torchrun_command
from ace3_worker.sandbox.identity import lease_identity
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.sandbox.plan import SandboxPlan
from ace3_worker.workspace import job_owner

# The rank reports what it sees of the machine's GPUs before it builds the model.
MODEL_FILE = """
import os

import torch
from torch import nn


def build_model():
    nodes = sorted(name for name in os.listdir("/dev") if name.startswith("nvidia"))
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(f"gpu-check: visible={os.environ.get('CUDA_VISIBLE_DEVICES')} count={count} "
          f"nodes={','.join(nodes)}", flush=True)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
"""

# The same report from a plain process (no torchrun, no engine).
PROBE = (
    "import os, torch; nodes = sorted(n for n in os.listdir('/dev') if n.startswith('nvidia')); "
    "count = torch.cuda.device_count() if torch.cuda.is_available() else 0; "
    "print(f\"gpu-check: visible={os.environ.get('CUDA_VISIBLE_DEVICES')} count={count} "
    "nodes={','.join(nodes)}\", flush=True)"
)

JOB_SECONDS = 240


def sandbox_missing() -> str | None:
    """Why this machine cannot run the worker's bubblewrap sandbox, or None when it can."""
    if os.geteuid() != 0:
        return "the worker's sandbox gives each job a uid of its own: run as root"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (scripts/gpu-check.sh unpacks the one it carries)"
    isolated = subprocess.run(
        [sys.executable, "-I", "-c", "import ace3_worker, ace3"], capture_output=True, text=True
    )
    if isolated.returncode != 0:
        return (
            "ace3 is not importable by an isolated interpreter (as in the sandbox): install it "
            "(scripts/gpu-check.sh adds a .pth file to this Python's site-packages)"
        )
    namespaces = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--unshare-pid", "--", "true"],
        capture_output=True, text=True,
    )  # fmt: skip
    if namespaces.returncode != 0:
        return f"bubblewrap cannot make namespaces here: {namespaces.stderr.strip()[-300:]}"
    return None


def worker_settings(root: Path) -> Settings:
    """A root worker's settings (``ACE3_WORKER_*`` from the environment) with its own data,
    lock directories and job uids under ``root``."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    return Settings(
        data_dir=root / "data",
        sandbox="bwrap",
        sandbox_uid_base=61900,
        sandbox_uid_count=4,
        sandbox_lock_dir=root / "locks",
        worker_gpu_lock_dir=root / "gpu-locks",
    )


@dataclass
class AttemptRun:
    returncode: int
    lines: list[str]
    directory: JobDirectory
    visible_devices: str

    def events(self) -> list[dict[str, Any]]:
        text = self.directory.events_file.read_text()
        return [json.loads(line) for line in text.splitlines()]

    def reports(self) -> list[str]:
        """The attempt's ``gpu-check:`` lines (without a rank prefix the log may add)."""
        return [line[line.index("gpu-check:") :] for line in self.lines if "gpu-check:" in line]


def write_job(directory: JobDirectory, config: dict[str, Any]) -> list[str]:
    """The attempt's model file, data and job.json; the worker's torchrun command for it."""
    code, data = directory.root / "code", directory.root / "data"
    code.mkdir()
    data.mkdir()
    (code / "model.py").write_text(MODEL_FILE)
    generator = np.random.default_rng(0)
    inputs = generator.standard_normal((256, 64)).astype(np.float32)
    np.savez(data / "train.npz", X=inputs, y=inputs[:, :10].argmax(axis=1).astype(np.int64))
    job = {
        "job_id": "gpu-check",
        "config": config,
        "model": {"path": str(directory.visible(code / "model.py")), "factory": "build_model"},
        "dataset": {"path": str(directory.visible(data / "train.npz"))},
        "output_dir": str(directory.visible(directory.output_dir)),
    }
    directory.job_file.write_text(json.dumps(job))
    return torchrun_command(str(directory.visible(directory.job_file)), 1)


def run_attempt(
    settings: Settings, plan: SandboxPlan, device: str, command: list[str] | None = None
) -> AttemptRun:
    """Run the worker's torchrun of a small job (or ``command``) in a sandbox on ``device``,
    with one device of the worker's list; wait for it and return what it printed."""
    pool = device_pool(settings)
    assert pool is not None, "the worker has no device list"
    devices = DeviceAllocator(pool, settings.resolved_worker_gpu_lock_dir).acquire(1)
    identity = (
        lease_identity(settings.sandbox_lock_dir, settings.sandbox_uid_base,
                       settings.sandbox_uid_count)
        if plan.dedicated_uids
        else None
    )  # fmt: skip
    try:
        work = settings.resolved_work_dir
        traversable_dir(work)
        directory = make_skeleton(
            work / f"attempt-{device}-{secrets.token_hex(4)}",
            job_owner(identity),
            plan.visible_root,
        )
        config = {"num_gpus": 1, "epochs": 1, "batch_size": 32, "max_steps": 4,
                  "log_interval": 1, "validation_split": 0.0}  # fmt: skip
        job_command = write_job(directory, config)
        env = job_environment(
            settings, directory, identity, device=device, job_id="gpu-check", nproc=1,
            visible_devices=devices.visible_devices,
        )  # fmt: skip
        running = start_torchrun(
            settings, plan, JobLimits.from_settings(settings),
            LaunchSpec(command or job_command), env, directory=directory, identity=identity,
            device=device,
        )  # fmt: skip
        try:
            running.process.wait(timeout=JOB_SECONDS)
        finally:
            returncode = running.stop()
        lines: list[str] = []
        while True:
            try:
                lines.append(running.lines.get_nowait().line)
            except queue.Empty:
                break
        return AttemptRun(returncode, lines, directory, devices.visible_devices)
    finally:
        devices.release()
        if identity is not None:
            identity.release()
