"""GPU memory through the engine on a real GPU: the CUDA allocator's figures and NVML's
utilisation in the metrics and the summary, asynchronous checkpoints staged into pinned host
memory (non-blocking copies that must be complete and stay as of their step), and a real CUDA
out-of-memory error in a step, which halves the micro-batch and lets the run go on with the
same effective batch."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from torch import nn

from ace3.runtime.checkpoint.background import stage_to_cpu
from ace3.runtime.checkpoint.files import load_checkpoint
from ace3.runtime.loop.hooks import TrainingHook
from tests.gpu.engine_runs import classification_data, finite_weights, losses, mlp, train

pytestmark = pytest.mark.gpu

MIB = 1 << 20


def test_cuda_memory_figures_are_the_allocator_s() -> None:
    # A 4096 x 4096 layer: 64 MiB of weights, as much again of gradients and twice that of
    # AdamW's moments: the peak cannot be under 256 MiB.
    model = nn.Sequential(
        nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.Linear(4096, 10)
    )
    run = train(model, classification_data(256), optimizer="adamw")
    final = run.final_metrics
    assert final["memory_device"] == "cuda"
    assert 256 <= final["peak_memory_mb"] <= torch.cuda.max_memory_allocated() / MIB + 1
    reported = dict(run.history["memory_mb_rank0"])
    assert all(value >= 64 for value in reported.values()), reported
    assert max(value for _, value in run.history["peak_memory_mb_max"]) >= 256


def test_nvml_utilisation_is_reported_for_the_job_s_gpu() -> None:
    pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed here")
    run = train(mlp(hidden=1024), classification_data(2048))
    utilisation = [value for _, value in run.history.get("gpu_util_rank0", [])]
    assert utilisation, "no gpu_util_rank0: NVML did not find this process's GPU by its UUID"
    assert all(0.0 <= value <= 100.0 for value in utilisation)
    assert "gpu_util_mean" in run.history and "gpu_util_min" in run.history


def test_stage_to_cpu_copies_cuda_tensors_into_reused_pinned_buffers() -> None:
    weight = torch.randn(1024, 1024, device="cuda")
    state = {"model": {"w": weight, "tied": weight}, "optimizer": [torch.ones(8, device="cuda")]}
    buffers: dict[str, torch.Tensor] = {}
    staged = stage_to_cpu(state, buffers)
    expected = weight.cpu()
    weight.add_(1.0)  # the training goes on: the staged copy stays as of the save
    assert staged["model"]["w"].is_pinned() and staged["optimizer"][0].is_pinned()
    assert torch.equal(staged["model"]["w"], expected)
    assert staged["model"]["tied"] is staged["model"]["w"]
    again = stage_to_cpu(state, buffers)
    assert again["model"]["w"].data_ptr() == staged["model"]["w"].data_ptr(), "buffer reused"
    assert torch.equal(again["model"]["w"], weight.cpu())


class WeightsAt(TrainingHook):
    """The model's weights, copied to the CPU synchronously, after each optimizer step."""

    wants_batch_logs = True

    def __init__(self) -> None:
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_batch_end(self, batch: int, logs: dict[str, float]) -> None:
        state = self.run.model.state_dict()
        self.weights[int(logs["step"])] = {k: v.detach().cpu().clone() for k, v in state.items()}


def test_async_checkpoints_staged_from_the_gpu_hold_their_step_s_weights(tmp_path: Path) -> None:
    hook = WeightsAt()
    model = mlp()
    run = train(
        model, classification_data(), hooks=[hook], checkpoint_dir=tmp_path, async_save=True,
        save_interval=4,
    )  # fmt: skip
    steps = [int(path.stem.removeprefix("step-")) for path in run.checkpoints]
    assert len(steps) >= 2 and set(steps) <= {4, 8, 12, 16} and 16 in steps, run.checkpoints
    for path, step in zip(run.checkpoints, steps, strict=True):
        weights = load_checkpoint(path)["model"]
        for name, value in hook.weights[step].items():
            assert torch.equal(weights[name], value), f"{path.name}: {name}"
    assert finite_weights(model)


class Wide(nn.Module):
    """Each sample's 64 features are spread over ``width`` positions (``64 x width`` float32
    activations per sample, about 32 MiB at the default width, several times over in the
    backward pass), then pooled and classified: the step's memory grows with its batch."""

    def __init__(self, width: int = 131072) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.spread = nn.Parameter(torch.linspace(-1.0, 1.0, width))
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(x.unsqueeze(-1) * self.spread).mean(dim=-1))


def test_a_cuda_out_of_memory_step_halves_the_micro_batch_and_training_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = classification_data(256)
    reference = train(Wide(), data)  # (no cap: a step of 32 samples takes about 3 GiB)
    capsys.readouterr()
    # Cap this process's CUDA allocator 2.25 GiB above what it holds: a step of 32 samples
    # (about 3 GiB) cannot run, one of 16 (about 1.5 GiB) can.
    gc.collect()  # (the reference run's model and activations go)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    cap = torch.cuda.memory_reserved() + int(2.25 * (1 << 30))
    torch.cuda.set_per_process_memory_fraction(cap / total)
    recovered = train(Wide(), data)
    printed = capsys.readouterr().out
    assert "out of memory at step 1 with micro-batch 32: retrying with micro-batch 16" in printed
    assert recovered.final_metrics["micro_batch_split"] == 2
    assert recovered.final_metrics["steps"] == reference.final_metrics["steps"] == 8
    for a, b in zip(losses(recovered), losses(reference), strict=True):
        assert a == pytest.approx(b, rel=1e-4)
