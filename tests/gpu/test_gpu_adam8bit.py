"""8-bit Adam on a real GPU: ACE3's own blockwise-quantized moments computed on CUDA tensors
(they must follow float32 AdamW closely), and the engine's ``optimizer="adam8bit"`` handing the
work to bitsandbytes' CUDA kernels where bitsandbytes is installed (scripts/gpu-check.sh installs
the wheel it carries; the check is skipped, with that reason, where it is not)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ace3.runtime.loop.hooks import TrainingHook
from ace3.training.optimizers import Adam8bit
from tests.gpu.engine_runs import classification_data, finite_weights, learned, mlp, train

pytestmark = pytest.mark.gpu


def _regression(seed: int) -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    layer = nn.Linear(256, 256).cuda()  # 65,536 weights: above min_8bit_size, quantized
    inputs = torch.randn(512, 256, device="cuda")
    return layer, inputs, inputs.flip(dims=[1])


def test_ace3_s_own_8bit_moments_follow_adamw_on_cuda() -> None:
    runs = []
    for make in (
        lambda p: Adam8bit(p, lr=1e-3, weight_decay=0.01, use_bitsandbytes=False),
        lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01),
    ):
        layer, inputs, targets = _regression(0)
        optimizer = make(layer.parameters())
        for _ in range(20):
            optimizer.zero_grad()
            nn.functional.mse_loss(layer(inputs), targets).backward()
            optimizer.step()
        runs.append((layer.weight.detach(), optimizer))
    (eight_bit, optimizer), (reference, _) = runs
    state = optimizer.state[optimizer.param_groups[0]["params"][0]]
    assert optimizer.backend == "ace3"
    assert state["exp_avg_code"].dtype == torch.uint8 and state["exp_avg_code"].is_cuda
    # (On the CPU the same 20 steps end 5% of AdamW's distance travelled away from it.)
    moved = (reference - _regression(0)[0].weight.detach()).norm()
    assert (eight_bit - reference).norm() < 0.15 * moved, "8-bit moments strayed from AdamW's"


class StateAtEnd(TrainingHook):
    """The optimizer's backend and the dtypes and devices of its state when training ends."""

    def on_train_end(self, logs: dict[str, float]) -> None:
        optimizer = self.run.optimizer
        self.backend = getattr(optimizer, "backend", None)
        self.state = {
            (value.dtype, value.device.type)
            for entry in optimizer.state.values()
            for value in entry.values()
            if isinstance(value, torch.Tensor) and value.numel() > 1
        }


def test_the_engine_s_adam8bit_runs_bitsandbytes_kernels_on_cuda() -> None:
    bitsandbytes = pytest.importorskip(
        "bitsandbytes",
        reason="bitsandbytes is not installed (scripts/gpu-check.sh installs the wheel it "
        "carries; run scripts/gpu-check.sh --prepare where pip can reach the index)",
    )
    hook = StateAtEnd()
    model = mlp(hidden=256)
    run = train(model, classification_data(1024), hooks=[hook], optimizer="adam8bit")
    assert hook.backend == "bitsandbytes", f"bitsandbytes {bitsandbytes.__version__} not used"
    assert (torch.uint8, "cuda") in hook.state, hook.state
    assert finite_weights(model) and learned(run)
