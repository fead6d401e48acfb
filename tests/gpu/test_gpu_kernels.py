"""The engine's CUDA kernel choices on a real GPU: torch's fused optimizers (``optimizer_impl``
auto picks them when every parameter is a CUDA tensor, also beside the float16 loss scaler), the
flash and memory-efficient attention kernels (``attention_backend`` restricts
``scaled_dot_product_attention`` to one of them for the whole run, and the run goes through only
if that kernel takes the call), and ``torch.compile`` in ``reduce-overhead`` mode, whose CUDA
graphs must be recorded and replayed for the training steps (not skipped)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ace3.runtime.loop.hooks import RunContext
from tests.gpu.engine_runs import (
    Recorder,
    classification_data,
    finite_weights,
    learned,
    losses,
    mlp,
    sequence_data,
    train,
)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    ("optimizer", "precision"),
    [("adamw", {}), ("adam", {}), ("sgd", {}),
     ("adamw", {"mixed_precision": True, "amp_dtype": "float16"})],
    ids=["adamw", "adam", "sgd", "adamw-float16-loss-scaler"],
)  # fmt: skip
def test_auto_picks_torch_s_fused_optimizer_on_cuda(
    optimizer: str, precision: dict[str, Any]
) -> None:
    def fused(run: RunContext) -> tuple[Any, ...]:
        groups = run.optimizer.param_groups
        return (
            type(run.optimizer).__name__.lower(),
            run.optimizer.defaults.get("fused"),
            {group.get("fused") for group in groups},
            {p.device.type for group in groups for p in group["params"]},
        )

    recorder = Recorder(fused)
    model = mlp()
    before = [p.detach().clone() for p in model.parameters()]
    train(
        model, classification_data(), hooks=[recorder], optimizer=optimizer,
        optimizer_impl="auto", **precision,
    )  # fmt: skip
    assert recorder.seen == (optimizer, True, {True}, {"cuda"})
    after = [p.detach().cpu() for p in model.parameters()]
    assert all(not torch.equal(a, b.cpu()) for a, b in zip(after, before, strict=True))
    assert finite_weights(model)


class Attention(nn.Module):
    """One self-attention layer through ``F.scaled_dot_product_attention``, mean-pooled into
    two classes; notes which attention kernels were allowed while it trained."""

    def __init__(self, width: int = 32, heads: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.head = nn.Linear(width, 2)
        self.allowed: set[tuple[bool, bool, bool]] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if self.training:
            self.allowed.add(
                (
                    torch.backends.cuda.flash_sdp_enabled(),
                    torch.backends.cuda.mem_efficient_sdp_enabled(),
                    torch.backends.cuda.math_sdp_enabled(),
                )
            )
        attended = F.scaled_dot_product_attention(q, k, v)
        return self.head(attended.transpose(1, 2).reshape(batch, length, width).mean(dim=1))


@pytest.mark.parametrize(
    ("backend", "allowed"),
    [("flash", (True, False, False)), ("efficient", (False, True, False))],
    ids=["flash", "efficient"],
)
def test_attention_backend_trains_on_that_kernel_alone(
    backend: str, allowed: tuple[bool, bool, bool]
) -> None:
    # bfloat16 autocast gives the kernels the half-precision inputs flash attention needs; with
    # every other kernel off, torch raises "No available kernel" unless this one runs the call.
    model = Attention()
    run = train(
        model, sequence_data(), attention_backend=backend, mixed_precision=True,
        amp_dtype="bfloat16", learning_rate=3e-3,
    )  # fmt: skip
    assert model.allowed == {allowed}
    assert torch.backends.cuda.math_sdp_enabled(), "the restriction ends with the run"
    assert finite_weights(model) and len(losses(run)) == 8


def _cuda_graphs_recorded() -> int:
    """How many CUDA graphs the cudagraph trees of this device recorded (torch's own
    bookkeeping of reduce-overhead; 0 when none was)."""
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), False)
    if manager is None:
        return 0
    return sum(len(nodes) for nodes in manager.roots.values())


def test_compile_reduce_overhead_replays_cuda_graphs_for_the_training_steps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_trees import reset_cudagraph_trees

    eager = train(mlp(), classification_data())
    reset_cudagraph_trees()
    counters.clear()
    model = mlp()
    run = train(model, classification_data(), compile=True, compile_mode="reduce-overhead")
    assert "torch.compile: the model, in place (mode=reduce-overhead)" in capsys.readouterr().out
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    assert _cuda_graphs_recorded() >= 1, "no CUDA graph was recorded"
    assert "forward" not in model.__dict__, "the module is given back uncompiled"
    # The same first step (same weights and batch) as eager; then it learns as eager does.
    assert losses(run)[0] == pytest.approx(losses(eager)[0], rel=1e-4)
    assert len(losses(run)) == len(losses(eager)) == 16
    assert finite_weights(model) and learned(run)
