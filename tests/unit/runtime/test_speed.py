"""Speed settings in an in-process run: ``compile=True`` trains the same loss curve as eager
(and really compiles), keeps plain checkpoint keys and leaves the caller's module eager;
``attention_backend`` restricts scaled_dot_product_attention's kernels (flash and efficient are
refused off CUDA); ``optimizer_impl`` picks torch's kernels; combinations that cannot work are
refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ace3
from ace3.config import TrainingConfig, unsupported_settings
from ace3.errors import UnsupportedFeatureError
from ace3.runtime.checkpoint.files import load_checkpoint
from ace3.runtime.loop.optim import build_optimizer

# compile=True against eager, float32 on the CPU: inductor may fuse and reorder the
# reductions, so the losses agree to this relative tolerance (in practice they are equal).
COMPILE_RTOL = 1e-5


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(96, 8, generator=generator)
    return inputs, inputs[:, :3].argmax(dim=1)


def _model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _train(module: nn.Module, save_dir: Path | None = None, **fields: object):
    config = TrainingConfig(
        epochs=1, batch_size=16, learning_rate=0.05, validation_split=0.0, log_interval=1,
        max_steps=5, **fields,
    )  # fmt: skip
    checkpoints = ace3.CheckpointConfig(save_dir=str(save_dir)) if save_dir else None
    return ace3.Trainer(config, checkpoint_config=checkpoints).train(module, _data())


def test_compile_trains_the_same_loss_curve_as_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch._inductor.config
    from torch._dynamo.utils import counters

    # Inductor compiles in this process: a pool of compile workers costs more than it saves
    # for two small graphs on a small machine.
    monkeypatch.setattr(torch._inductor.config, "compile_threads", 1)

    eager = _train(_model())
    counters.clear()
    module = _model()
    compiled = _train(module, tmp_path / "ckpt", compile=True)
    assert counters["frames"]["ok"] >= 1  # dynamo compiled the forward pass
    want = [loss for _, loss in eager.history["train_loss"]]
    got = [loss for _, loss in compiled.history["train_loss"]]
    assert len(got) == 5
    assert got == pytest.approx(want, rel=COMPILE_RTOL)
    # The checkpoint holds the module's own names (no _orig_mod. prefix) ...
    state = load_checkpoint(compiled.checkpoints[-1])
    assert (
        list(state["model"])
        == list(module.state_dict())
        == ["0.weight", "0.bias", "2.weight", "2.bias"]
    )
    # ... and the caller's module is eager again.
    assert "forward" not in vars(module)


class _Attention(nn.Module):
    """One self-attention layer through F.scaled_dot_product_attention; records which SDPA
    kernels were allowed while it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        self.allowed: list[tuple[bool, bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.allowed.append((
            torch.backends.cuda.flash_sdp_enabled(),
            torch.backends.cuda.mem_efficient_sdp_enabled(),
            torch.backends.cuda.math_sdp_enabled(),
        ))  # fmt: skip
        q = self.proj(x.view(x.shape[0], 2, 4))
        return self.head(F.scaled_dot_product_attention(q, q, q).mean(dim=1))


def test_attention_backend_math_restricts_sdpa_and_flash_is_refused_on_cpu() -> None:
    inputs = torch.randn(16, 8)
    data = (inputs, (inputs[:, 0] > 0).long())
    config = TrainingConfig(
        epochs=1, batch_size=8, max_steps=1, validation_split=0.0, attention_backend="math"
    )
    module = _Attention()
    ace3.Trainer(config).train(module, data)
    assert module.allowed == [(False, False, True)]
    assert torch.backends.cuda.flash_sdp_enabled()  # put back after the run
    with pytest.raises(UnsupportedFeatureError, match=r"attention_backend='flash'.*CUDA"):
        ace3.Trainer(config.model_copy(update={"attention_backend": "flash"})).train(
            _Attention(), data
        )


def test_optimizer_impl_picks_torchs_kernels() -> None:
    def built(impl: str, name: str = "adamw") -> torch.optim.Optimizer:
        model = nn.Linear(3, 2)
        return build_optimizer(
            model.parameters(), TrainingConfig(optimizer=name, optimizer_impl=impl)
        )

    assert built("fused").defaults["fused"] is True  # torch has CPU kernels for it
    assert built("foreach", "sgd").defaults["foreach"] is True
    assert built("for_loop", "adam").defaults["foreach"] is False
    # auto on the CPU: torch's default (fused is only chosen for CUDA parameters)
    assert not built("auto").defaults["fused"] and built("auto").defaults["foreach"] is None
    # The fused kernel gives the same update as the loop.
    params = []
    for impl in ("fused", "for_loop"):
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        optimizer = build_optimizer(
            model.parameters(), TrainingConfig(optimizer_impl=impl, weight_decay=0.1)
        )
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.ones(4, 3)).square().sum().backward()
            optimizer.step()
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(params[0], params[1])


def test_what_cannot_be_combined_is_refused() -> None:
    def fields(**kwargs: object) -> list[str]:
        return [p.field for p in unsupported_settings(TrainingConfig(**kwargs))]

    assert fields(compile_mode="max-autotune") == ["compile_mode"]
    assert fields(compile=True, num_gpus=2, parallelism="pipeline") == ["compile"]
    assert fields(compile=True, num_gpus=2, tensor_parallel_size=2) == ["compile"]
    assert fields(compile=True, optimizer="sophia") == ["compile"]
    assert fields(optimizer="lion", optimizer_impl="fused") == ["optimizer_impl"]
    assert fields(compile=True, num_gpus=2, zero_stage=3, gradient_checkpointing=True) == []
    assert fields(allow_tf32=True, attention_backend="flash") == []  # (a CUDA worker runs them)
