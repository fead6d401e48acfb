"""The user's optimizer: a ``torch.optim`` class by name (with ``optimizer_kwargs``) and a model
file's ``configure_optimizers(model)``, adopted by each strategy (one in-process rank)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

import ace3
from ace3.config import TrainingConfig
from ace3.errors import UnsupportedFeatureError
from ace3.runtime.loop.optim import build_optimizer
from ace3.runtime.loop.precision import resolve_precision
from ace3.runtime.parallel import strategy_for
from ace3.runtime.process.distributed import destroy_distributed, init_distributed
from ace3.runtime.user_code import UserCode


def _params() -> list[nn.Parameter]:
    return list(nn.Linear(4, 3).parameters())


def test_a_class_name_gets_lr_weight_decay_and_kwargs_and_torch_defaults() -> None:
    config = TrainingConfig(optimizer="Adadelta", learning_rate=1.0)
    optimizer = build_optimizer(_params(), config)
    assert type(optimizer) is torch.optim.Adadelta
    reference = torch.optim.Adadelta(_params(), lr=1.0).defaults
    assert optimizer.defaults == reference  # none of ACE3's betas/eps/momentum
    sgd = build_optimizer(_params(), TrainingConfig(optimizer="SGD", learning_rate=20.0))
    assert (sgd.defaults["lr"], sgd.defaults["momentum"]) == (20.0, 0)
    adam = build_optimizer(
        _params(),
        TrainingConfig(
            optimizer="Adam",
            weight_decay=0.1,
            optimizer_kwargs={"betas": [0.5, 0.6], "amsgrad": True},
        ),
    )
    assert (adam.defaults["betas"], adam.defaults["amsgrad"]) == ((0.5, 0.6), True)
    assert adam.defaults["weight_decay"] == 0.1


def test_values_torch_refuses_name_optimizer_kwargs() -> None:
    config = TrainingConfig(optimizer="SGD", optimizer_kwargs={"momentum": -1.0})
    with pytest.raises(
        ValueError, match=r"optimizer_kwargs \{'momentum': -1\.0\}: torch\.optim\.SGD"
    ):
        build_optimizer(_params(), config)


def test_the_sdk_checks_the_values_before_a_job_is_submitted() -> None:
    trainer = ace3.Trainer(TrainingConfig(optimizer="SGD", optimizer_kwargs={"momentum": -1.0}))
    with pytest.raises(UnsupportedFeatureError, match="Invalid momentum value") as caught:
        trainer.resolve_config()  # (what a remote run submits; torch is imported here)
    assert caught.value.problems[0].field == "optimizer_kwargs"


def _user(configure: Any) -> UserCode:
    return UserCode(
        module=ModuleType("m"),
        factory=lambda: None,
        factory_name="build_model",
        compute_loss=None,
        compute_metrics=None,
        configure_optimizers=configure,
    )


def _adadelta_with_step_lr(model: nn.Module) -> tuple[Any, Any]:
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)


def _built(config: TrainingConfig, configure: Any) -> tuple[Any, Any, nn.Module]:
    ctx = init_distributed(config)
    strategy = strategy_for(config, ctx)
    precision = resolve_precision(config, ctx.device)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    local = strategy.prepare(model, precision, _user(configure), None, False)
    return strategy, strategy.make_optimizer(local, precision, _user(configure)), local


LAYOUTS = {
    "ddp": {},
    "zero-1": {"zero_stage": 1},
    "zero-3": {"zero_stage": 3},
    "tensor": {"parallelism": "model", "model_sharding_strategy": "tensor"},
    "pipeline": {"parallelism": "pipeline", "num_stages": 1},
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_strategy_honours_configure_optimizers(layout: str) -> None:
    config = TrainingConfig(batch_size=4, **LAYOUTS[layout])
    try:
        strategy, optimizer, local = _built(config, _adadelta_with_step_lr)
        assert (
            type(strategy).__name__
            == {
                "ddp": "DataParallel",
                "zero-1": "ZeroRedundancy",
                "zero-3": "FullyShardedDataParallel",
                "tensor": "TensorParallel",
                "pipeline": "PipelineParallel",
            }[layout]
        )
        scheduler = strategy.configured_scheduler
        assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR)
        assert scheduler.optimizer is optimizer
        if layout == "zero-1":  # ZeRO-1 wraps it: Adadelta runs on each rank's share
            assert isinstance(optimizer, ZeroRedundancyOptimizer)
            assert type(optimizer.optim) is torch.optim.Adadelta
        else:  # built over the prepared module's (sharded, split: DTensor) parameters
            assert type(optimizer) is torch.optim.Adadelta
            held = {id(p) for g in optimizer.param_groups for p in g["params"]}
            assert held == {id(p) for p in local.parameters()}
        for param in local.parameters():
            param.grad = torch.ones_like(param)
        optimizer.step()
        scheduler.step()
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.7)
    finally:
        destroy_distributed()


@pytest.mark.parametrize(
    ("fields", "configure", "error", "match"),
    [
        ({"mixed_precision": True, "amp_level": "O2", "amp_dtype": "bfloat16"},
         lambda m: torch.optim.SGD(m.parameters(), lr=0.1), UnsupportedFeatureError, "master"),
        ({"lr_scheduler": {"name": "step", "params": {"step_size": 1}}},
         _adadelta_with_step_lr, ValueError, "keep one of the two"),
        ({}, lambda m: torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1), ValueError,
         "not the model's"),
        ({}, lambda m: "sgd", TypeError, "must return a torch.optim.Optimizer"),
    ],
)  # fmt: skip
def test_configure_optimizers_refusals(fields, configure, error, match) -> None:
    try:
        with pytest.raises(error, match=match):
            _built(TrainingConfig(batch_size=4, **fields), configure)
    finally:
        destroy_distributed()


def _recipe_run(save_dir: Any, max_steps: int, resume: bool = False) -> Any:
    torch.manual_seed(3)
    module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 16, generator=generator)
    targets = inputs[:, :4].argmax(dim=1)
    config = TrainingConfig(
        optimizer="Adadelta", learning_rate=1.0, optimizer_kwargs={"rho": 0.95},
        lr_scheduler={"name": "step", "params": {"step_size": 2, "gamma": 0.7}},
        batch_size=32, epochs=1, max_steps=max_steps, validation_split=0.0, log_interval=1,
    )  # fmt: skip
    checkpoints = ace3.CheckpointConfig(save_dir=str(save_dir)) if save_dir else None
    trainer = ace3.Trainer(config, checkpoint_config=checkpoints)
    return module, trainer.train(module, (inputs, targets), resume=resume)


def test_a_class_name_optimizer_resumes_exactly(tmp_path: Any) -> None:
    whole, expected = _recipe_run(None, 6)
    _recipe_run(tmp_path, 3)
    resumed_module, resumed = _recipe_run(tmp_path, 6, resume=True)
    assert [lr for _, lr in expected.history["learning_rate"]] == pytest.approx(
        [1.0, 1.0, 0.7, 0.7, 0.49, 0.49]
    )
    assert resumed.history["train_loss"] == expected.history["train_loss"][3:]
    for got, want in zip(resumed_module.parameters(), whole.parameters(), strict=True):
        assert torch.equal(got, want)
