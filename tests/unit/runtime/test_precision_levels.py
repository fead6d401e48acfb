"""Engine precision levels O0-O3 (ace3.runtime.loop.precision) on CPU: dtypes, training, checkpoints."""

from __future__ import annotations

import math
from collections import namedtuple
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ace3.config import TrainingConfig
from ace3.runtime.loop.evaluation import evaluate
from ace3.runtime.loop.precision import Precision, cast_floating, resolve_precision
from ace3.training.amp import GradientScaler, StaticLossScaler

CPU = torch.device("cpu")
LEVELS = ["O0", "O1", "O2", "O3"]


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()  # 3 classes
    return x, y


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def _precision(level: str, dtype: str = "bfloat16", **fields: Any) -> Precision:
    config = TrainingConfig(mixed_precision=True, amp_level=level, amp_dtype=dtype, **fields)
    return resolve_precision(config, CPU)


def _train(
    precision: Precision, model: nn.Module, steps: int, overflow_step: int | None = None
) -> tuple[list[float], list[bool], torch.optim.Optimizer]:
    """The engine's loop order: 2 micro-batches per step, unscale + clip, step, update, copy."""
    x, y = _data()
    precision.prepare_model(model)
    optimizer = torch.optim.SGD(precision.optimizer_parameters(model), lr=0.05, momentum=0.9)
    scaler = precision.make_scaler()
    losses, changed = [], []
    for step in range(steps):
        before = [p.detach().clone() for p in model.parameters()]
        precision.zero_grad(optimizer)
        step_loss = 0.0
        for xb, yb in ((x[:32], y[:32]), (x[32:], y[32:])):
            with precision.autocast():
                loss = nn.functional.cross_entropy(model(xb).float(), yb)
            step_loss += float(loss.detach()) / 2
            if step == overflow_step:
                loss = loss * math.inf
            scaler.scale(loss / 2).backward()
        precision.grads_to_optimizer()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(precision.clip_parameters(model), 5.0)
        scaler.step(optimizer)
        scaler.update()
        precision.weights_from_optimizer()
        losses.append(step_loss)
        changed.append(
            any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        )
    return losses, changed, optimizer


@pytest.mark.parametrize(
    ("fields", "level", "dtype", "keep_bn", "description"),
    [
        ({}, "O0", None, False, "O0 float32"),
        ({"mixed_precision": True, "amp_level": "O0"}, "O0", None, False, "O0 float32"),
        ({"amp_level": "O2"}, "O0", None, False, "O0 float32"),  # mixed_precision=False wins
        (
            {"mixed_precision": True},
            "O1",
            torch.bfloat16,
            False,
            "O1 bfloat16 (autocast, fp32 weights)",
        ),
        (
            {"mixed_precision": True, "amp_level": "O2"},
            "O2",
            torch.bfloat16,
            True,
            "O2 bfloat16 (fp32 master weights, BatchNorm fp32)",
        ),
        (
            {"mixed_precision": True, "amp_level": "O2", "keep_batchnorm_fp32": False},
            "O2",
            torch.bfloat16,
            False,
            "O2 bfloat16 (fp32 master weights, BatchNorm bfloat16)",
        ),
        (
            {"mixed_precision": True, "amp_level": "O3", "amp_dtype": "float16"},
            "O3",
            torch.float16,
            False,
            "O3 float16 (no master weights, BatchNorm float16, dynamic loss scale 65536)",
        ),
        (
            {"mixed_precision": True, "amp_level": "O3", "keep_batchnorm_fp32": True},
            "O3",
            torch.bfloat16,
            True,
            "O3 bfloat16 (no master weights, BatchNorm fp32)",
        ),
        (
            {"mixed_precision": True, "amp_dtype": "float16", "loss_scaling": 128.0},
            "O1",
            torch.float16,
            False,
            "O1 float16 (autocast, fp32 weights, static loss scale 128)",
        ),
    ],
)
def test_resolve_precision(
    fields: dict[str, Any], level: str, dtype: torch.dtype | None, keep_bn: bool, description: str
) -> None:
    precision = resolve_precision(TrainingConfig(**fields), CPU)
    assert (precision.level, precision.dtype, precision.keep_batchnorm_fp32) == (
        level,
        dtype,
        keep_bn,
    )
    assert precision.enabled == (dtype is not None)
    assert precision.describe() == description
    assert precision.make_scaler().is_enabled() == (dtype == torch.float16)


@pytest.mark.parametrize("level", LEVELS)
def test_each_level_trains_with_bfloat16(level: str) -> None:
    precision = _precision(level)
    model = _mlp()
    losses, changed, optimizer = _train(precision, model, steps=25)
    assert all(changed) and losses[-1] < 0.6 * losses[0], losses

    linear, batchnorm = model[0], model[1]
    weights = {"O0": torch.float32, "O1": torch.float32}.get(level, torch.bfloat16)
    bn = torch.float32 if level in ("O0", "O1", "O2") else torch.bfloat16
    assert linear.weight.dtype == weights and model[3].bias.dtype == weights
    assert batchnorm.weight.dtype == bn and batchnorm.running_mean.dtype == bn
    optimized = optimizer.param_groups[0]["params"]
    if level == "O2":
        assert all(p.dtype == torch.float32 for p in optimized)
        assert optimized[0] is not linear.weight and optimized[2] is batchnorm.weight
    else:
        assert [id(p) for p in optimized] == [id(p) for p in model.parameters()]

    state = precision.model_state_dict(model)
    assert set(state) == set(model.state_dict())
    assert all(v.dtype == torch.float32 for v in state.values() if v.is_floating_point())
    if level == "O2":  # the masters, not their bfloat16 rounding
        assert torch.equal(state["0.weight"], optimized[0])
        assert torch.equal(state["0.weight"].to(torch.bfloat16), linear.weight)
    plain = _mlp()
    plain.load_state_dict(state)  # a checkpoint loads into a plain float32 model

    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=16)
    user = SimpleNamespace(compute_loss=None, compute_metrics=None)
    metrics = evaluate(model, loader, CPU, precision, user)  # type: ignore[arg-type]
    assert math.isfinite(metrics["val_loss"]) and metrics["val_accuracy"] > 0.5


def test_o2_batchnorm_computes_in_float32_under_autocast() -> None:
    precision = _precision("O2")
    model = precision.prepare_model(_mlp())
    seen: dict[str, torch.dtype] = {}
    model[1].register_forward_hook(
        lambda module, args, output: seen.update(input=args[0].dtype, output=output.dtype)
    )
    with precision.autocast():
        output = model(_data()[0])
    assert seen == {"input": torch.float32, "output": torch.bfloat16}
    assert output.dtype == torch.float32


def test_o2_masters_keep_updates_that_bfloat16_rounds_away() -> None:
    """An SGD update of 1e-4 on a weight of 1.0 is below bfloat16's resolution (2**-8)."""

    def run(level: str) -> tuple[float, float]:
        precision = _precision(level)
        model = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(1.0)
        precision.prepare_model(model)
        optimizer = torch.optim.SGD(precision.optimizer_parameters(model), lr=1e-4)
        scaler = precision.make_scaler()
        for _ in range(40):
            precision.zero_grad(optimizer)
            with precision.autocast():
                loss = model(torch.ones(1, 1)).sum()  # d loss / d weight = 1
            scaler.scale(loss).backward()
            precision.grads_to_optimizer()
            scaler.step(optimizer)
            scaler.update()
            precision.weights_from_optimizer()
        master = precision.model_state_dict(model)["weight"]
        return float(model.weight.detach()), float(master)

    o3_weight, o3_saved = run("O3")
    assert o3_weight == 1.0 and o3_saved == 1.0  # every update was rounded away
    o2_weight, o2_master = run("O2")
    assert o2_master == pytest.approx(1.0 - 40 * 1e-4, abs=1e-6)
    assert o2_weight == 1.0 - 2**-8  # the master, rounded to bfloat16


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_float16_scaler_skips_exactly_the_overflowing_step(level: str) -> None:
    precision = _precision(level, "float16", init_loss_scale=1024.0)
    model = _mlp()
    losses, changed, optimizer = _train(precision, model, steps=8, overflow_step=3)
    scaler = precision.scaler
    assert isinstance(scaler, GradientScaler) and scaler.is_enabled()
    assert changed == [step != 3 for step in range(8)]
    assert scaler.skipped_steps == 1 and scaler.get_scale() == 512.0
    assert losses[-1] < losses[0]
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.isfinite(p).all() for p in optimizer.param_groups[0]["params"])


def test_float16_static_scaling_from_the_config() -> None:
    precision = _precision("O2", "float16", loss_scaling="static", init_loss_scale=256.0)
    _, changed, _ = _train(precision, _mlp(), steps=4, overflow_step=1)
    assert isinstance(precision.scaler, StaticLossScaler)
    assert changed == [True, False, True, True] and precision.scaler.get_scale() == 256.0


def test_o2_checkpoint_round_trip_restores_the_masters(tmp_path: Path) -> None:
    precision = _precision("O2")
    model = _mlp()
    _, _, optimizer = _train(precision, model, steps=3)
    path = tmp_path / "model.pt"
    torch.save(precision.model_state_dict(model), path)
    state = torch.load(path, weights_only=True)

    again = _precision("O2")
    fresh = again.prepare_model(_mlp())
    masters = again.optimizer_parameters(fresh)
    again.load_model_state_dict(fresh, state)
    assert torch.equal(masters[0], state["0.weight"])  # exact, not via bfloat16
    assert fresh[0].weight.dtype == torch.bfloat16
    assert torch.equal(fresh[0].weight, state["0.weight"].to(torch.bfloat16))
    assert torch.equal(fresh[1].running_var, state["1.running_var"])
    assert all(
        torch.equal(a, b) for a, b in zip(masters, optimizer.param_groups[0]["params"], strict=True)
    )
    o1 = _precision("O1")
    o1.load_model_state_dict(o1.prepare_model(_mlp()), state)  # across levels


@dataclass
class _Output:
    logits: torch.Tensor
    ids: torch.Tensor


class _KwargsModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.seen: dict[str, torch.dtype] = {}

    def forward(self, inputs: torch.Tensor, mask: torch.Tensor, ids: torch.Tensor) -> Any:
        self.seen = {"inputs": inputs.dtype, "mask": mask.dtype, "ids": ids.dtype}
        logits = self.linear(inputs * mask)
        pair = namedtuple("Pair", "a b")(logits, ids)
        return {"out": _Output(logits, ids), "pair": pair, "list": [logits]}


def test_o3_hooks_cast_floating_inputs_in_and_outputs_out() -> None:
    precision = _precision("O3")
    model = precision.prepare_model(_KwargsModel())
    out = model(torch.ones(2, 3), mask=torch.ones(2, 3), ids=torch.tensor([1, 2]))
    assert model.seen == {"inputs": torch.bfloat16, "mask": torch.bfloat16, "ids": torch.int64}
    assert out["out"].logits.dtype == torch.float32 and out["out"].ids.dtype == torch.int64
    assert out["pair"].a.dtype == torch.float32 and type(out["pair"]).__name__ == "Pair"
    assert out["list"][0].dtype == torch.float32
    assert cast_floating((1, "x", None), torch.float16) == (1, "x", None)


def test_misuse_is_refused_with_the_fix() -> None:
    precision = _precision("O2")
    model = _mlp()
    with pytest.raises(RuntimeError, match="prepare_model"):
        precision.optimizer_parameters(model)
    precision.prepare_model(model)
    with pytest.raises(RuntimeError, match="already"):
        precision.prepare_model(model)
    with pytest.raises(RuntimeError, match="another model"):
        precision.prepare_model(_mlp())
    with pytest.raises(ValueError, match="not the one given"):
        precision.optimizer_parameters(_mlp())
    with pytest.raises(TypeError, match=r"nn\.Module"):
        _precision("O1").prepare_model("model")  # type: ignore[arg-type]


def test_zero_grad_forgets_a_half_done_scaler_step() -> None:
    precision = _precision("O1", "float16")
    model = precision.prepare_model(_mlp())
    optimizer = torch.optim.SGD(precision.optimizer_parameters(model), lr=0.1)
    scaler = precision.make_scaler()
    x, y = _data()
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):  # the first step is abandoned after unscale_ (e.g. an OOM retry)
        precision.zero_grad(optimizer)
        with precision.autocast():
            loss = nn.functional.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # the second call is allowed: zero_grad reset the step
    scaler.step(optimizer)
    scaler.update()
    assert not scaler.last_step_skipped and scaler.get_scale() == 65536.0
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("level", LEVELS)
def test_restore_model_hands_back_a_float32_model(level: str) -> None:
    precision = _precision(level)
    model = _mlp()
    _, _, optimizer = _train(precision, model, steps=3)
    trained = {k: v.clone() for k, v in precision.model_state_dict(model).items()}
    assert precision.restore_model(model) is model
    assert all(
        t.dtype == torch.float32 for t in model.state_dict().values() if t.is_floating_point()
    )
    assert all(torch.equal(v, trained[k]) for k, v in model.state_dict().items())
    if level == "O2":  # the exact masters, not their bfloat16 rounding
        assert torch.equal(model[0].weight, optimizer.param_groups[0]["params"][0])
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert not model[1]._forward_pre_hooks and not model[1]._forward_hooks
    _train(precision, model, steps=1)  # bound again: a second run on the same module
