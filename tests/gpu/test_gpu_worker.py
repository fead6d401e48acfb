"""The worker's GPUs on a real GPU machine: ``ACE3_WORKER_GPUS`` resolved against the NVIDIA
driver's own table and device nodes (an index and a ``GPU-<uuid>`` name the same device; a GPU
the machine lacks is named), and an attempt in the worker's bubblewrap sandbox that sees exactly
the device it was handed (its ``CUDA_VISIBLE_DEVICES``, one CUDA device, only that GPU's device
node) and trains on it with torchrun and the engine; a CPU attempt's sandbox holds no GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from ace3_control.capacity import Capacity
from ace3_control.settings import Settings
from ace3_worker.device import device_pool, device_pool_problem, local_capacity
from ace3_worker.sandbox.gpus import DRIVER_TABLE, gpu_device_nodes
from ace3_worker.sandbox.plan import resolve_sandbox
from tests.gpu.sandboxed_job import PROBE, run_attempt, sandbox_missing, worker_settings

pytestmark = pytest.mark.gpu


def _gpu_nodes(nodes: tuple[str, ...]) -> list[str]:
    return [node for node in nodes if node.removeprefix("/dev/nvidia").isdigit()]


def test_worker_gpus_resolve_against_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACE3_WORKER_DEVICE", "cuda")
    monkeypatch.setenv("ACE3_WORKER_GPUS", "0")
    settings = Settings(data_dir=tmp_path)
    assert device_pool(settings) == ("0",)
    assert local_capacity(settings) == Capacity("cuda", 1)
    assert device_pool_problem(settings) is None
    nodes = gpu_device_nodes("0")
    assert "/dev/nvidiactl" in nodes and all(Path(node).exists() for node in nodes)
    assert len(_gpu_nodes(nodes)) == 1, nodes
    if DRIVER_TABLE.is_dir():  # (without the driver's table an index is taken as a node number)
        uuid = str(torch.cuda.get_device_properties(0).uuid)
        uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        assert gpu_device_nodes(uuid) == nodes, "an index and a UUID name the same GPU"
    missing = str(torch.cuda.device_count())
    monkeypatch.setenv("ACE3_WORKER_GPUS", missing)
    problem = device_pool_problem(Settings(data_dir=tmp_path))
    assert problem is not None and problem.startswith(f"ACE3_WORKER_GPUS={missing}: no ")


@pytest.fixture
def gpu_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """A root CUDA worker's settings with ``ACE3_WORKER_GPUS=0`` and the bubblewrap sandbox
    (skipped, with the reason, where this machine cannot run it)."""
    reason = sandbox_missing()
    if reason is not None:
        pytest.skip(reason)
    monkeypatch.setenv("ACE3_WORKER_DEVICE", "cuda")
    monkeypatch.setenv("ACE3_WORKER_GPUS", "0")
    return worker_settings(tmp_path)


def test_a_sandboxed_attempt_trains_on_exactly_its_bound_gpu(gpu_worker: Settings) -> None:
    plan = resolve_sandbox(gpu_worker)  # the worker's own start-up check, for real
    assert plan.mode == "bwrap"
    done = run_attempt(gpu_worker, plan, "cuda")
    assert done.returncode == 0, "\n".join(done.lines[-40:])
    bound = ",".join(sorted(Path(node).name for node in gpu_device_nodes("0")))
    assert done.visible_devices == "0"
    assert done.reports() == [f"gpu-check: visible=0 count=1 nodes={bound}"], done.lines
    summary = done.events()[-1]
    assert summary["type"] == "summary", summary
    assert summary["final_metrics"]["memory_device"] == "cuda"
    assert summary["final_metrics"]["steps"] == 4


def test_a_cpu_attempt_s_sandbox_holds_no_gpu(gpu_worker: Settings) -> None:
    plan = resolve_sandbox(gpu_worker)
    done = run_attempt(gpu_worker, plan, "cpu", [sys.executable, "-c", PROBE])
    assert done.returncode == 0, "\n".join(done.lines[-40:])
    assert done.reports() == ["gpu-check: visible=0 count=0 nodes="], done.lines
