"""Lion, Sophia, GaLore-AdamW and Adafactor (``TrainingConfig.optimizer``) against their update
rules written out by hand for a few steps; the polynomial schedule against its formula; the
settings that are refused; carrying client-built optimizers; GaLore's checkpointable state."""

from __future__ import annotations

import io
import math
import sys

import pytest
import torch
from torch import nn

import ace3
from ace3.config import TrainingConfig, unsupported_settings
from ace3.config.optimizer_settings import optimizer_settings
from ace3.errors import UnsupportedFeatureError
from ace3.runtime.loop.extra_optimizers import (
    MissingOptimizerPackageError,
    graph_keeping_backward,
    needs_grad_graph,
)
from ace3.runtime.loop.optim import build_optimizer, build_scheduler

STEPS = 3


def _gradients(seed: int, shape: tuple[int, ...]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for _ in range(STEPS)]


def _run(optimizer: torch.optim.Optimizer, param: nn.Parameter, grads: list[torch.Tensor]) -> None:
    for grad in grads:
        param.grad = grad.clone()
        optimizer.step()


def test_lion_is_the_sign_of_the_interpolated_momentum() -> None:
    start = torch.randn(4, 3)
    grads = _gradients(1, (4, 3))
    param = nn.Parameter(start.clone())
    config = TrainingConfig(
        optimizer="lion", learning_rate=0.01, weight_decay=0.1, lion_betas=(0.8, 0.95)
    )
    _run(build_optimizer([param], config), param, grads)
    expected, m = start.clone(), torch.zeros_like(start)
    for g in grads:
        expected *= 1 - 0.01 * 0.1  # decoupled weight decay
        expected -= 0.01 * torch.sign(0.8 * m + 0.2 * g)
        m = 0.95 * m + 0.05 * g
    torch.testing.assert_close(param.detach(), expected)


def test_adafactor_factors_the_second_moment_of_a_matrix() -> None:
    start = torch.randn(5, 3)
    grads = _gradients(2, (5, 3))
    param = nn.Parameter(start.clone())
    config = TrainingConfig(optimizer="adafactor", learning_rate=0.05, adafactor_d=1.0)
    _run(build_optimizer([param], config), param, grads)
    expected = start.clone()
    rows, cols = torch.zeros(5, 1), torch.zeros(1, 3)
    eps1, eps2 = torch.finfo(torch.float32).eps, 1e-3
    for t, g in enumerate(grads, start=1):
        keep = t**-0.8  # 1 - beta2_t with beta2_t = 1 - t^-0.8
        rho = min(0.05, 1 / math.sqrt(t))
        alpha = max(eps2, float(expected.norm() / math.sqrt(expected.numel()))) * rho
        rows = (1 - keep) * rows + keep * (g * g).mean(dim=1, keepdim=True)
        cols = (1 - keep) * cols + keep * (g * g).mean(dim=0, keepdim=True)
        v = rows @ cols / rows.mean().clamp(min=eps1)  # rank-1 estimate of E[g^2]
        update = g / v.clamp(min=eps1 * eps1).sqrt()
        rms = float(update.norm() / math.sqrt(update.numel()))
        expected -= alpha / max(1.0, rms / 1.0) * update
    torch.testing.assert_close(param.detach(), expected)


def test_galore_projects_a_matrix_gradient_and_adam_steps_in_the_subspace() -> None:
    start = torch.randn(6, 4)
    grads = _gradients(3, (6, 4))
    param = nn.Parameter(start.clone())
    config = TrainingConfig(
        optimizer="galore_adamw", learning_rate=0.01, galore_rank=2, galore_scale=0.5,
        galore_update_proj_gap=100, eps=1e-6,
    )  # fmt: skip
    optimizer = build_optimizer([param], config)
    _run(optimizer, param, grads)
    # 6 x 4 (rows >= columns): projected on the top-2 right singular vectors of step 1's
    # gradient, kept for update_proj_gap steps.
    basis = torch.linalg.svd(grads[0], full_matrices=False)[2][:2]  # 2 x 4
    expected, m, v = start.clone(), torch.zeros(6, 2), torch.zeros(6, 2)
    for t, g in enumerate(grads, start=1):
        low = g @ basis.T
        m = 0.9 * m + 0.1 * low
        v = 0.999 * v + 0.001 * low * low
        step = 0.01 * math.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        expected -= step * (m / (v.sqrt() + 1e-6)) @ basis * 0.5
    torch.testing.assert_close(param.detach(), expected, rtol=1e-4, atol=1e-5)
    # A vector parameter is not projected: it gets a group of its own (plain AdamW).
    model = nn.Linear(4, 3)
    groups = build_optimizer(model.parameters(), config).param_groups
    assert [len(g["params"]) for g in groups] == [1, 1] and "rank" not in groups[1]


def test_galore_state_is_saved_as_tensors_and_comes_back() -> None:
    model = nn.Linear(6, 5)
    config = TrainingConfig(optimizer="galore_adamw", galore_rank=2)
    optimizer = build_optimizer(model.parameters(), config)
    model(torch.randn(3, 6)).sum().backward()
    optimizer.step()
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    again = build_optimizer(model.parameters(), config)
    again.load_state_dict(torch.load(buffer, weights_only=True))  # no pickled objects
    saved, loaded = optimizer.state[model.weight], again.state[model.weight]
    assert type(loaded["projector"]) is type(saved["projector"])
    torch.testing.assert_close(loaded["projector"].ortho_matrix, saved["projector"].ortho_matrix)


def test_sophia_clips_the_momentum_over_a_hutchinson_hessian() -> None:
    # f(w) = 0.5 * sum(a * w^2): gradient a * w, Hessian diag(a); Rademacher probes give it
    # exactly. Period 2: the Hessian is estimated at steps 1 and 3, with create_graph=True.
    a = torch.tensor([0.5, 2.0, 8.0, 0.05])
    start = torch.tensor([1.0, -1.0, 0.5, 2.0])
    param = nn.Parameter(start.clone())
    config = TrainingConfig(
        optimizer="sophia", learning_rate=0.1, sophia_rho=0.5, sophia_update_period=2,
        sophia_betas=(0.9, 0.8),
    )  # fmt: skip
    optimizer = build_optimizer([param], config)
    graphs = []
    for _ in range(STEPS):
        graphs.append(needs_grad_graph(optimizer))
        optimizer.zero_grad(set_to_none=True)
        loss = 0.5 * (a * param * param).sum()
        (graph_keeping_backward if graphs[-1] else torch.Tensor.backward)(loss)
        optimizer.step()
    assert graphs == [True, False, True]
    expected, m, h = start.clone(), torch.zeros(4), torch.zeros(4)
    for t in range(1, STEPS + 1):
        g = a * expected
        m = 0.9 * m + 0.1 * g
        if t in (1, 3):
            h = 0.8 * h + 0.2 * a
        expected -= 0.1 * (m / h.clamp(min=1e-12)).clamp(-0.5, 0.5)
    torch.testing.assert_close(param.detach(), expected)


def test_sophia_trains_in_process_through_the_engine() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    inputs = torch.randn(64, 8)
    targets = (inputs[:, 0] > 0).long()
    config = TrainingConfig(
        optimizer="sophia", learning_rate=0.05, sophia_update_period=2, epochs=1,
        batch_size=16, max_steps=4, log_interval=1, validation_split=0.0,
    )  # fmt: skip
    run = ace3.Trainer(config).train(model, (inputs, targets))
    losses = [loss for _, loss in run.history["train_loss"]]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]


def test_polynomial_schedule_follows_its_formula_and_carries() -> None:
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    schedule = ace3.schedulers.PolynomialDecayScheduler(
        optimizer, warmup_steps=2, total_steps=6, power=2.0, min_lr=0.01
    )
    seen = []
    for _ in range(8):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()

    def reference(k: int) -> float:  # step k, 1-based
        if k <= 2:
            return 0.1 * k / 2
        if k >= 6:
            return 0.01
        return (0.1 - 0.01) * (1 - (k - 2) / (6 - 2)) ** 2 + 0.01

    assert seen == pytest.approx([reference(k) for k in range(1, 9)])
    spec = schedule.to_spec()
    assert spec.name == "polynomial" and spec.params["power"] == 2.0
    # A job rebuilds it from the spec; total_steps defaults to the job's steps.
    config = TrainingConfig(
        learning_rate=0.1, lr_scheduler={"name": "polynomial", "params": {"warmup_steps": 2}}
    )
    driver = build_scheduler(torch.optim.SGD([param], lr=0.1), config, total_steps=6)
    assert driver is not None and driver.scheduler.total_steps == 6
    with pytest.raises(ValueError, match="'warmup_steps' \\(7\\) must be <= 'total_steps'"):
        TrainingConfig(
            lr_scheduler={"name": "polynomial", "params": {"warmup_steps": 7, "total_steps": 6}}
        )


def test_settings_of_another_optimizer_and_unsupported_layouts_are_refused() -> None:
    def fields(**kwargs: object) -> list[str]:
        return [p.field for p in unsupported_settings(TrainingConfig(**kwargs))]

    assert fields(optimizer="adamw", galore_rank=8) == ["galore_rank"]
    assert fields(optimizer="lion", betas=(0.8, 0.9)) == ["betas"]
    assert fields(optimizer="lion", num_gpus=2, zero_stage=1) == ["optimizer"]
    assert fields(optimizer="galore_adamw", num_gpus=2, zero_stage=3) == ["optimizer"]
    assert fields(optimizer="sophia", num_gpus=2) == ["optimizer"]
    assert fields(optimizer="sophia", mixed_precision=True, max_grad_norm=1.0) == [
        "mixed_precision",
        "max_grad_norm",
    ]
    assert fields(optimizer="adafactor", num_gpus=2, adafactor_d=2.0) == []
    with pytest.raises(ValueError, match=r"(?s)lion_betas.*must both be in"):
        TrainingConfig(optimizer="lion", lion_betas=(1.5, 0.9))


def test_a_missing_library_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pytorch_optimizer", None)  # import fails
    with pytest.raises(MissingOptimizerPackageError, match=r"pip install 'ace3\[optimizers\]'"):
        build_optimizer([nn.Parameter(torch.zeros(2))], TrainingConfig(optimizer="lion"))


def test_client_built_lion_and_adafactor_are_carried_sophia_is_refused() -> None:
    import pytorch_optimizer

    model = nn.Linear(3, 2)
    lion = pytorch_optimizer.Lion(model.parameters(), lr=3e-4, betas=(0.9, 0.98))
    assert optimizer_settings(lion, model) == {
        "optimizer": "lion", "learning_rate": 3e-4, "weight_decay": 0.0,
        "lion_betas": (0.9, 0.98),
    }  # fmt: skip
    adafactor = torch.optim.Adafactor(model.parameters(), lr=0.02, beta2_decay=-0.5)
    carried = optimizer_settings(adafactor, model)
    assert carried["optimizer"] == "adafactor" and carried["adafactor_beta2_decay"] == -0.5
    rebuilt = build_optimizer(model.parameters(), TrainingConfig(**carried))
    assert rebuilt.param_groups[0]["beta2_decay"] == -0.5
    with pytest.raises(UnsupportedFeatureError, match="SophiaH cannot be carried"):
        optimizer_settings(pytorch_optimizer.SophiaH(model.parameters()))
