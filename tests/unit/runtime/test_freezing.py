"""``freeze`` / ``trainable``: frozen parameters stay bitwise as they were, get no optimizer
state, and a pattern that matches nothing (or leaves nothing to train) is refused by name."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import ace3
from ace3.runtime.techniques.freezing import apply_freezing

_inputs = torch.linspace(-1.0, 1.0, 192).reshape(48, 4)
DATA = TensorDataset(_inputs, _inputs.sum(dim=1, keepdim=True))
BASE = {"batch_size": 8, "epochs": 2, "validation_split": 0.0, "learning_rate": 0.05, "seed": 0}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(torch.tanh(self.embed(x))))


def _train(tmp_path: Path, **fields: object) -> tuple[dict[str, torch.Tensor], nn.Module, dict]:
    torch.manual_seed(0)
    model = Net()
    before = {name: value.detach().clone() for name, value in model.state_dict().items()}
    config = ace3.TrainingConfig(**{**BASE, **fields})
    save_dir = tmp_path / "ckpt"
    ace3.Trainer(config, checkpoint_config=ace3.CheckpointConfig(save_dir=str(save_dir))).train(
        model, DATA
    )
    newest = max(save_dir.glob("*.pt"), key=lambda path: path.stat().st_mtime)
    return before, model, torch.load(newest, weights_only=True)


def _optimizer_tensors(checkpoint: dict) -> int:
    groups = checkpoint["optimizer"]["param_groups"]
    return sum(len(group["params"]) for group in groups)


def test_frozen_parameters_stay_bitwise_and_get_no_optimizer_state(tmp_path: Path) -> None:
    before, model, checkpoint = _train(tmp_path, freeze=["embed", "body.0.*"])
    after = model.state_dict()
    frozen = {"embed.weight", "embed.bias", "body.0.weight", "body.0.bias"}
    for name, value in after.items():
        if name in frozen:
            assert torch.equal(value, before[name]), name
        else:
            assert not torch.equal(value, before[name]), f"{name} did not train"
    assert _optimizer_tensors(checkpoint) == len(after) - len(frozen)
    assert len(checkpoint["optimizer"]["state"]) == len(after) - len(frozen)


def test_trainable_trains_only_the_matching_parameters(tmp_path: Path, capfd) -> None:
    before, model, checkpoint = _train(tmp_path, trainable=["head*"])
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]) != name.startswith("head."), name
    assert _optimizer_tensors(checkpoint) == 2
    assert "training 2 of 8 parameter tensors (9 of 193 elements" in capfd.readouterr().out


def test_a_pattern_that_matches_nothing_is_refused_by_name() -> None:
    config = ace3.TrainingConfig(**BASE, freeze=["embed", "encoder.*"])
    with pytest.raises(ValueError, match=r"freeze: the pattern 'encoder\.\*' matches no param"):
        apply_freezing(Net(), config)


def test_freezing_everything_is_refused() -> None:
    config = ace3.TrainingConfig(**BASE, freeze=["*"])
    with pytest.raises(ValueError, match="leaves no parameter to train"):
        apply_freezing(Net(), config)


def test_freeze_and_trainable_together_or_empty_patterns_are_invalid() -> None:
    with pytest.raises(pydantic.ValidationError, match="cannot both be set"):
        ace3.TrainingConfig(freeze=["a"], trainable=["b"])
    with pytest.raises(pydantic.ValidationError, match="freeze"):
        ace3.TrainingConfig(freeze=[" "])
    assert ace3.TrainingConfig(freeze=["a"]).model_dump()["freeze"] == ["a"]
