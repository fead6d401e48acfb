"""``optimizer`` takes ACE3's names or any ``torch.optim`` class name; ``optimizer_kwargs`` is
checked without torch against the generated table, which must equal the installed torch's;
``learning_rate`` has no upper bound; ``shuffle`` defaults to True."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

import pydantic
import pytest
import torch

from ace3.config import TrainingConfig, unsupported_settings
from ace3.config.search_checks import search_space_problems
from ace3.config.torch_optimizers import TORCH_OPTIMIZERS, TORCH_VERSION
from ace3.hp import HPConfig, choice


def _json_kind(annotation: Any) -> str:
    """An argument's annotation as the table writes it (see ``ace3.config.torch_optimizers``)."""
    if annotation is inspect.Parameter.empty:
        return "any"
    args, origin = typing.get_args(annotation), typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        (kept,) = [a for a in args if a is not type(None) and a is not torch.Tensor]
        return _json_kind(kept) + ("?" if type(None) in args else "")
    if origin is tuple:
        return "(" + ",".join(_json_kind(a) for a in args) + ")"
    return {bool: "boolean", float: "number", int: "integer", str: "string"}[annotation]


def _installed_table() -> dict[str, dict[str, str]]:
    table = {}
    for name in sorted(dir(torch.optim)):
        cls = getattr(torch.optim, name)
        if inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer):
            if cls is torch.optim.Optimizer:
                continue
            params = list(inspect.signature(cls.__init__).parameters.values())[1:]
            table[name] = {p.name: _json_kind(p.annotation) for p in params if p.name != "params"}
    return table


def test_the_torch_free_table_is_the_installed_torch_optim() -> None:
    installed = _installed_table()
    assert installed == TORCH_OPTIMIZERS, (
        f"torch {torch.__version__} differs from the table of torch {TORCH_VERSION}: "
        "regenerate sdk/ace3/config/torch_optimizers.py with\nTORCH_OPTIMIZERS = " + repr(installed)
    )
    assert torch.__version__.startswith(TORCH_VERSION)


def test_class_names_are_case_sensitive_and_take_their_own_kwargs() -> None:
    config = TrainingConfig(optimizer="Adadelta", learning_rate=1.0, optimizer_kwargs={"rho": 0.95})
    assert (config.optimizer, config.optimizer_kwargs) == ("Adadelta", {"rho": 0.95})
    assert TrainingConfig(optimizer="sgd").optimizer == "sgd"  # ACE3's own name still
    for name, kwargs in [  # values of each JSON kind, as the API receives them
        ("Adafactor", {"eps": [None, 1e-3], "foreach": None, "d": 1}),
        ("Muon", {"ns_steps": 5, "ns_coefficients": [3.4, -4.7, 2], "adjust_lr_fn": None}),
        ("Rprop", {"etas": [0.5, 1.2], "maximize": True}),
    ]:
        assert TrainingConfig(optimizer=name, optimizer_kwargs=kwargs).optimizer_kwargs == kwargs
    with pytest.raises(pydantic.ValidationError, match="did you mean 'Adadelta'"):
        TrainingConfig(optimizer="adadelta")
    with pytest.raises(pydantic.ValidationError, match="unknown optimizer 'Lamb'"):
        TrainingConfig(optimizer="Lamb")
    with pytest.raises(pydantic.ValidationError, match="LBFGS steps with a closure"):
        TrainingConfig(optimizer="LBFGS")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"optimizer": "Adadelta", "optimizer_kwargs": {"betas": [0.9, 0.99]}},
         "'betas': not an argument of torch.optim.Adadelta"),
        ({"optimizer": "SGD", "optimizer_kwargs": {"lr": 0.1}}, "set learning_rate"),
        ({"optimizer": "adamw", "optimizer_kwargs": {"amsgrad": True}}, "'AdamW'"),
        ({"optimizer": "SGD", "optimizer_kwargs": {"momentum": object()}}, "optimizer_kwargs"),
        ({"optimizer": "Adadelta", "optimizer_kwargs": {"rho": "0.9"}},
         r"optimizer_kwargs\['rho'\]: '0.9' is not a number"),
        ({"optimizer": "SGD", "optimizer_kwargs": {"nesterov": 1}},
         r"optimizer_kwargs\['nesterov'\]: 1 is not a boolean"),
        ({"optimizer": "Muon", "optimizer_kwargs": {"ns_steps": 5.5}},
         r"'ns_steps'\]: 5.5 is not an integer"),
        ({"optimizer": "Adam", "optimizer_kwargs": {"betas": [0.9]}},
         r"'betas'\]: \[0.9\] is not a list of 2 \(a number, a number\)"),
        ({"optimizer": "SGD", "optimizer_kwargs": {"momentum": None}}, "is not a number,"),
    ],
)  # fmt: skip
def test_bad_kwargs_are_refused_at_construction_naming_the_field(fields, match) -> None:
    with pytest.raises(pydantic.ValidationError, match=match) as caught:
        TrainingConfig(**fields)
    assert caught.value.errors()[0]["loc"][0] == "optimizer_kwargs"


def test_assigning_a_name_that_does_not_take_the_kwargs_keeps_the_old_one() -> None:
    config = TrainingConfig(optimizer="Adadelta", optimizer_kwargs={"rho": 0.9})
    with pytest.raises(pydantic.ValidationError, match=r"optimizer_kwargs is for a torch\.optim"):
        config.optimizer = "adamw"
    assert config.optimizer == "Adadelta"
    with pytest.raises(
        pydantic.ValidationError, match=r"'rho': not an argument of torch\.optim\.RMSprop"
    ):
        config.optimizer = "RMSprop"
    assert config.optimizer == "Adadelta"
    config.optimizer = "Adadelta"  # (re-assigning the same name is fine)


def test_settings_a_class_name_optimizer_would_ignore_are_refused() -> None:
    problems = {
        p.field: p.reason
        for p in unsupported_settings(
            TrainingConfig(optimizer="Rprop", weight_decay=0.1, betas=(0.8, 0.9), momentum=0.5)
        )
    }
    assert "torch.optim.Rprop has no weight decay" in problems["weight_decay"]
    assert "torch.optim.Rprop has no 'betas'" in problems["betas"]
    assert "momentum" in problems
    twice = TrainingConfig(optimizer="SGD", weight_decay=0.1, optimizer_kwargs={"weight_decay": 1})
    assert [p.field for p in unsupported_settings(twice)] == ["weight_decay"]
    assert unsupported_settings(TrainingConfig(optimizer="SGD", weight_decay=0.1)) == []


def test_learning_rate_is_positive_and_finite_with_no_upper_bound() -> None:
    assert TrainingConfig(learning_rate=20.0).learning_rate == 20.0
    assert TrainingConfig(learning_rate=1e6).learning_rate == 1e6
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(pydantic.ValidationError, match="learning_rate"):
            TrainingConfig(learning_rate=bad)


def test_shuffle_defaults_on() -> None:
    assert TrainingConfig().shuffle is True
    assert TrainingConfig(shuffle=False).shuffle is False


def test_a_search_may_choose_among_class_names() -> None:
    good = HPConfig(search_space={"optimizer": choice(["adamw", "Adadelta", "RMSprop"])})
    assert search_space_problems(good) == ([], [])
    bad = HPConfig(search_space={"optimizer": choice(["adamw", "adadelta"])})
    _, invalid = search_space_problems(bad)
    assert len(invalid) == 1 and "did you mean 'Adadelta'" in invalid[0]
