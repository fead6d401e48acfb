"""Loss scalers (ace3.amp): overflow skips, growth/backoff, bounds, static scale, state, ranks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ace3.config import AMPConfig, TrainingConfig
from ace3.runtime.loop.precision import resolve_precision
from ace3.training.amp import (
    DynamicLossScaler,
    GradientScaler,
    LossScaler,
    StaticLossScaler,
    autocast,
    make_loss_scaler,
    resolve_amp_dtype,
)

X = torch.linspace(-1.0, 1.0, 16).reshape(8, 2)
Y = X.sum(dim=1, keepdim=True)


def _setup(seed: int = 0) -> tuple[nn.Linear, torch.optim.SGD]:
    torch.manual_seed(seed)
    model = nn.Linear(2, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, scaler: LossScaler, overflow: bool
) -> Any:
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(model(X), Y)
    if overflow:
        loss = loss * math.inf
    scaler.scale(loss).backward()
    result = scaler.step(optimizer)
    scaler.update()
    return result


def test_overflow_skips_exactly_that_step_and_backs_off() -> None:
    model, optimizer = _setup()
    scaler = GradientScaler(init_scale=1024.0, growth_interval=100)
    _train_step(model, optimizer, scaler, overflow=False)
    before = _params(model)
    assert _train_step(model, optimizer, scaler, overflow=True) is None
    assert _same(before, _params(model))
    assert scaler.skipped_steps == 1 and scaler.last_step_skipped
    assert scaler.get_scale() == 512.0 and scaler.growth_tracker == 0
    assert all(torch.isfinite(p).all() for p in model.parameters())
    _train_step(model, optimizer, scaler, overflow=False)
    assert not _same(before, _params(model)) and not scaler.last_step_skipped
    assert scaler.skipped_steps == 1 and scaler.get_scale() == 512.0


def test_unscale_gives_the_true_gradients() -> None:
    model, optimizer = _setup()
    loss = nn.functional.mse_loss(model(X), Y)
    (expected,) = torch.autograd.grad(loss, [model.weight])
    scaler = GradientScaler(init_scale=256.0)
    scaler.scale(nn.functional.mse_loss(model(X), Y)).backward()
    assert torch.allclose(model.weight.grad, expected * 256.0)
    scaler.unscale_(optimizer)
    assert torch.allclose(model.weight.grad, expected)
    with pytest.raises(RuntimeError, match="already called"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)  # no second division
    scaler.update()
    assert scaler.skipped_steps == 0


def test_growth_after_exactly_growth_interval_clean_steps() -> None:
    model, optimizer = _setup()
    scaler = GradientScaler(init_scale=8.0, growth_factor=2.0, growth_interval=3)
    scales = []
    for overflow in [False, False, False, False, True, False, False, False]:
        _train_step(model, optimizer, scaler, overflow)
        scales.append(scaler.get_scale())
    # grows on the 3rd clean step; the overflow halves it and restarts the count.
    assert scales == [8.0, 8.0, 16.0, 16.0, 8.0, 8.0, 8.0, 16.0]


def test_dynamic_loss_scaler_uses_scale_factor_and_window() -> None:
    model, optimizer = _setup()
    scaler = DynamicLossScaler(init_scale=2**10, scale_factor=4.0, scale_window=2)
    assert scaler.scale_factor == 4.0 and scaler.scale_window == 2
    _train_step(model, optimizer, scaler, overflow=True)
    assert scaler.get_scale() == 2**8
    _train_step(model, optimizer, scaler, overflow=False)
    _train_step(model, optimizer, scaler, overflow=False)
    assert scaler.get_scale() == 2**10


def test_scale_is_clamped_to_min_and_max() -> None:
    model, optimizer = _setup()
    low = GradientScaler(init_scale=4.0, min_scale=2.0)
    for _ in range(3):
        _train_step(model, optimizer, low, overflow=True)
    assert low.get_scale() == 2.0 and low.skipped_steps == 3
    high = GradientScaler(init_scale=8.0, growth_interval=1, max_scale=16.0)
    for _ in range(3):
        _train_step(model, optimizer, high, overflow=False)
    assert high.get_scale() == 16.0
    assert GradientScaler(init_scale=1e9, max_scale=1024.0).get_scale() == 1024.0


def test_static_scaler_never_changes_but_skips_overflows() -> None:
    model, optimizer = _setup()
    scaler = StaticLossScaler(128.0)
    for step in range(6):
        before = _params(model)
        _train_step(model, optimizer, scaler, overflow=step == 2)
        assert scaler.get_scale() == 128.0
        assert _same(before, _params(model)) == (step == 2)
    assert scaler.skipped_steps == 1 and not scaler.dynamic


def test_disabled_scaler_is_a_pass_through() -> None:
    model, optimizer = _setup()
    scaler = GradientScaler(enabled=False)
    loss = nn.functional.mse_loss(model(X), Y)
    assert scaler.scale(loss) is loss and scaler.get_scale() == 1.0
    loss.backward()
    grad = model.weight.grad.clone()
    scaler.unscale_(optimizer)
    assert torch.equal(model.weight.grad, grad)
    before = _params(model)
    scaler.step(optimizer)
    scaler.update()
    assert not _same(before, _params(model)) and not scaler.is_enabled()


def test_state_dict_round_trip(tmp_path: Path) -> None:
    model, optimizer = _setup()
    scaler = GradientScaler(init_scale=64.0, growth_interval=3)
    for overflow in [False, True, False, False]:
        _train_step(model, optimizer, scaler, overflow)
    path = tmp_path / "scaler.pt"
    torch.save(scaler.state_dict(), path)
    state = torch.load(path, weights_only=True)
    restored = GradientScaler(init_scale=64.0, growth_interval=3)
    restored.load_state_dict(state)
    assert restored.state_dict() == scaler.state_dict()
    assert (restored.get_scale(), restored.growth_tracker, restored.skipped_steps) == (32.0, 2, 1)
    _train_step(model, optimizer, restored, overflow=False)  # the 3rd clean step: grows
    assert restored.get_scale() == 64.0
    static = StaticLossScaler(8.0)
    static.load_state_dict({"scale": 1024.0, "skipped_steps": 5})
    assert static.get_scale() == 8.0 and static.skipped_steps == 5
    torch_state = torch.amp.GradScaler("cpu", init_scale=512.0).state_dict()
    torch_state["_growth_tracker"] = 7
    GradientScaler().load_state_dict(torch_state)
    with pytest.raises(ValueError, match="no 'scale'"):
        restored.load_state_dict({})


def test_bad_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="init_scale"):
        GradientScaler(init_scale=0.0)
    with pytest.raises(ValueError, match="growth_factor"):
        GradientScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="backoff_factor"):
        GradientScaler(backoff_factor=1.5)
    with pytest.raises(ValueError, match="growth_interval"):
        GradientScaler(growth_interval=0)
    with pytest.raises(ValueError, match="min_scale"):
        GradientScaler(min_scale=10.0, max_scale=1.0)
    with pytest.raises(ValueError, match="scale_window"):
        DynamicLossScaler(scale_window=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scale"):
        StaticLossScaler(-1.0)
    with pytest.raises(TypeError, match="loss"):
        GradientScaler().scale(1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="optimizer"):
        GradientScaler().step(object())  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="step"):
        GradientScaler().update()
    with pytest.raises(ValueError, match="dtype"):
        autocast(dtype=torch.float32)
    model, optimizer = _setup()
    scaler = GradientScaler()
    scaler.scale(nn.functional.mse_loss(model(X), Y)).backward()
    with pytest.raises(ValueError, match="closure"):
        scaler.step(optimizer, lambda: 0.0)


def test_make_loss_scaler_from_config() -> None:
    config = TrainingConfig(
        mixed_precision=True,
        init_loss_scale=1024.0,
        loss_scale_growth_factor=4.0,
        loss_scale_backoff_factor=0.25,
        loss_scale_window=10,
        min_loss_scale=2.0,
        max_loss_scale=4096.0,
    )
    dynamic = make_loss_scaler(config, torch.float16)
    assert isinstance(dynamic, GradientScaler) and dynamic.is_enabled()
    state = dynamic.state_dict()
    assert (state["scale"], state["growth_factor"], state["backoff_factor"]) == (1024.0, 4.0, 0.25)
    assert (state["growth_interval"], state["min_scale"], state["max_scale"]) == (10, 2.0, 4096.0)
    assert not make_loss_scaler(config, torch.bfloat16).is_enabled()
    assert not make_loss_scaler(config, None).is_enabled()
    static = make_loss_scaler(config.model_copy(update={"loss_scaling": "static"}), torch.float16)
    assert isinstance(static, StaticLossScaler) and static.get_scale() == 1024.0
    fixed = make_loss_scaler(config.model_copy(update={"loss_scaling": 128.0}), torch.float16)
    assert isinstance(fixed, StaticLossScaler) and fixed.get_scale() == 128.0
    with pytest.raises(ValueError, match="loss_scaling"):
        make_loss_scaler(config.model_copy(update={"loss_scaling": -2.0}), torch.float16)
    amp = AMPConfig(
        opt_level="O2", loss_scale="dynamic", min_loss_scale=1.0, max_loss_scale=65536.0
    )
    from_amp = make_loss_scaler(amp, torch.float16)
    assert from_amp.state_dict()["max_scale"] == 65536.0 and from_amp.get_scale() == 65536.0


def test_autocast_defaults() -> None:
    assert resolve_amp_dtype("auto", "cpu") == torch.bfloat16
    assert resolve_amp_dtype("float16", "cpu") == torch.float16
    with autocast(device_type="cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast(dtype=torch.float16, device_type="cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16
    with autocast(enabled=False, device_type="cpu"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    if not torch.cuda.is_available():
        with autocast():  # defaults to the CPU here
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
        with pytest.raises(ValueError, match="device_type='cuda'"):
            autocast(device_type="cuda")


class _LossModel(nn.Module):
    """A model whose forward returns its loss, as in ``loss = model(batch)``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 1)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        inputs, targets = batch
        return nn.functional.mse_loss(self.net(inputs).float(), targets)


def test_document_gradient_scaling_loop_runs_as_written() -> None:
    from ace3 import amp as ace3  # ace3.autocast / ace3.GradientScaler are these names

    torch.manual_seed(0)
    model = _LossModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dataloader = [(X, Y)] * 30
    first = float(model((X, Y)).detach())

    # Custom gradient scaling
    scaler = ace3.GradientScaler(
        init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000
    )

    # Use in training loop
    for batch in dataloader:
        optimizer.zero_grad()
        with ace3.autocast():
            loss = model(batch)

        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    assert float(model((X, Y)).detach()) < first / 4 and scaler.skipped_steps == 0


def test_document_dynamic_loss_scaler_loop_runs_as_written() -> None:
    from ace3 import amp as ace3

    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    dataloader, targets = [X] * 30, Y
    first = float(criterion(model(X), Y).detach())

    # Dynamic loss scaling
    loss_scaler = ace3.DynamicLossScaler(init_scale=2**16, scale_factor=2.0, scale_window=2000)

    # Use in training loop
    for batch in dataloader:
        optimizer.zero_grad()
        with ace3.autocast():
            outputs = model(batch)
            loss = criterion(outputs, targets)

        scaled_loss = loss_scaler.scale(loss)
        scaled_loss.backward()

        loss_scaler.step(optimizer)
        loss_scaler.update()

    assert float(criterion(model(X), Y).detach()) < first / 4 and loss_scaler.skipped_steps == 0


def _o2_ddp_steps(rank: int) -> dict[str, torch.Tensor]:
    """O2 bfloat16 under DDP (bf16 and fp32 BatchNorm parameters): 3 steps on per-rank data."""
    precision = resolve_precision(
        TrainingConfig(mixed_precision=True, amp_level="O2"), torch.device("cpu")
    )
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    precision.prepare_model(net)
    optimizer = torch.optim.SGD(precision.optimizer_parameters(net), lr=0.1)
    scaler = precision.make_scaler()
    ddp = DistributedDataParallel(net)
    for _ in range(3):
        precision.zero_grad(optimizer)
        with precision.autocast():
            loss = nn.functional.mse_loss(ddp(X + rank), Y)
        scaler.scale(loss).backward()
        precision.grads_to_optimizer()
        scaler.step(optimizer)
        scaler.update()
        precision.weights_from_optimizer()
    return {k: v for k, v in precision.model_state_dict(net).items() if "running" not in k}


def _two_rank_worker(rank: int, rendezvous: str, out_dir: str) -> None:
    """Rank 1 alone overflows on the second step; both ranks must skip it."""
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    try:
        torch.manual_seed(0)  # same weights on both ranks; no DDP: grads are not averaged
        model = nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = GradientScaler(init_scale=1024.0)
        record = []
        for step in range(3):
            before = _params(model)
            _train_step(model, optimizer, scaler, overflow=(rank == 1 and step == 1))
            record.append((scaler.last_step_skipped, _same(before, _params(model))))
        torch.save(
            {
                "record": record,
                "scale": scaler.get_scale(),
                "skipped": scaler.skipped_steps,
                "o2_ddp": _o2_ddp_steps(rank),
            },
            Path(out_dir) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def test_two_ranks_skip_the_same_step_and_o2_ddp_stays_in_sync(tmp_path: Path) -> None:
    rendezvous = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(_two_rank_worker, args=(rendezvous, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        result = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        # (skipped, params unchanged) per step: only step 1 skipped, on both ranks.
        assert result["record"] == [(False, False), (True, True), (False, False)], rank
        assert result["skipped"] == 1 and result["scale"] == 512.0
    # O2 under DDP: gradients averaged over both ranks' data, the same float32 weights after.
    states = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True)["o2_ddp"] for r in (0, 1)]
    torch.manual_seed(0)
    initial = nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))
    for name, value in states[0].items():
        assert torch.equal(value, states[1][name]), name
        assert value.dtype == torch.float32 or not value.is_floating_point(), name
    assert not torch.equal(states[0]["0.weight"], initial[0].weight.detach())
