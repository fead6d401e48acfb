"""Mixed precision and TF32 on a real GPU, through the engine: float16 autocast with the loss
scaler meeting real float16 overflows (the scale backs off, overflowing steps are skipped, the
scale grows again after clean windows, the weights stay finite), O2's float16 weights with
float32 masters, bfloat16 autocast, and ``allow_tf32`` changing what float32 matmuls compute."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch import nn

from ace3.runtime.loop.hooks import RunContext
from tests.gpu.engine_runs import (
    Recorder,
    classification_data,
    finite_weights,
    learned,
    mlp,
    train,
)

pytestmark = pytest.mark.gpu


def test_float16_loss_scaling_backs_off_from_real_overflows_then_grows() -> None:
    # At 2**24 the scaled loss's gradient overflows float16 in the first backward passes (a
    # logit's gradient is about scale / batch); each overflowing step is skipped and halves the
    # scale until the gradients fit; then every 4 clean steps double it (until it overflows).
    model = mlp()
    run = train(
        model, classification_data(1024), mixed_precision=True, amp_dtype="float16",
        amp_level="O1", init_loss_scale=2.0**24, loss_scale_window=4,
    )  # fmt: skip
    scales = [value for _, value in run.history["loss_scale"]]
    assert scales[0] < 2.0**24, "the first step at 2**24 must overflow float16 and back off"
    assert run.final_metrics["skipped_steps"] >= 1
    assert any(later > earlier for earlier, later in itertools.pairwise(scales)), (
        f"the scale never grew after clean windows of 4 steps: {scales}"
    )
    assert all(p.dtype == torch.float32 for p in model.parameters())  # O1: float32 weights
    assert finite_weights(model) and learned(run)


def test_o2_trains_float16_weights_from_float32_masters() -> None:
    def dtypes(run: RunContext) -> tuple[set[torch.dtype], set[torch.dtype]]:
        masters = {p.dtype for group in run.optimizer.param_groups for p in group["params"]}
        return {p.dtype for p in run.model.parameters()}, masters

    recorder = Recorder(dtypes)
    model = mlp()
    run = train(
        model, classification_data(), hooks=[recorder], mixed_precision=True,
        amp_dtype="float16", amp_level="O2",
    )  # fmt: skip
    assert recorder.seen == ({torch.float16}, {torch.float32})
    assert all(p.dtype == torch.float32 for p in model.parameters())  # given back as float32
    assert "loss_scale" in run.final_metrics and finite_weights(model) and learned(run)


class AutocastWitness(nn.Module):
    """An MLP that notes, in training, whether autocast is on and its first layer's output
    dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()
        self.seen: set[tuple[bool, torch.dtype]] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.net[0](x)
        if self.training:
            self.seen.add((torch.is_autocast_enabled("cuda"), hidden.dtype))
        return self.net[1:](hidden)


def test_bfloat16_autocast_runs_without_a_loss_scaler() -> None:
    model = AutocastWitness()
    run = train(model, classification_data(), mixed_precision=True, amp_dtype="auto")
    assert model.seen == {(True, torch.bfloat16)}, "auto is bfloat16 on an Ampere-or-newer GPU"
    assert "loss_scale" not in run.history and "skipped_steps" not in run.final_metrics
    assert finite_weights(model) and learned(run)


def _matmul_error() -> float:
    """The relative error of a float32 matmul on the GPU against float64: about 1e-6 in full
    float32, about 1e-3 when TF32's 10-bit mantissa is allowed."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(1024, 1024, device="cuda", generator=generator)
    exact = a.double() @ a.double()
    return float(((a @ a).double() - exact).norm() / exact.norm())


def test_allow_tf32_makes_float32_matmuls_use_tf32_and_is_put_back() -> None:
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    def tf32(run: RunContext) -> dict[str, Any]:
        return {
            "flags": (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32),
            "error": _matmul_error(),
        }

    recorder = Recorder(tf32)
    run = train(mlp(), classification_data(), hooks=[recorder], allow_tf32=True)
    assert recorder.seen["flags"] == (True, True)
    after = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    assert after == before
    full = _matmul_error()
    assert recorder.seen["error"] > 10 * full, (
        f"float32 matmul error {recorder.seen['error']:.2e} in the run vs {full:.2e} after it: "
        "TF32 was not used"
    )
    assert learned(run)
