"""Rank 0's copies of the model at the end (the merged LoRA model, the Hugging Face export): each
tensor is copied once at most, never shared with the model or between keys, and the merge copies
only the adapted layers' weights."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

import ace3
from ace3.runtime.loop.precision import resolve_precision
from ace3.runtime.parallel.sharding import float32_cpu_copies, rank0_float32_state
from ace3.runtime.techniques.lora import apply_lora
from ace3.runtime.techniques.lora_merge import merge_weights, whole_weights

pytest.importorskip("peft")


@pytest.fixture
def clones(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts ``Tensor.clone`` calls."""
    counted: list[int] = []
    clone = torch.Tensor.clone

    def counting(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        counted.append(1)
        return clone(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "clone", counting)
    yield counted


def _storage(tensor: torch.Tensor) -> int:
    return int(tensor.untyped_storage().data_ptr())


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))


def test_a_cast_is_the_only_copy_and_the_models_own_tensors_are_copied(
    clones: list[int],
) -> None:
    precision = resolve_precision(ace3.TrainingConfig(), torch.device("cpu"))
    half = _mlp().to(torch.bfloat16)
    state = rank0_float32_state(half, precision, is_main=True)
    assert not clones  # .to(float32) already copied: no clone after it
    assert all(value.dtype == torch.float32 for value in state.values())
    model = _mlp()
    state = rank0_float32_state(model, precision, is_main=True)
    assert len(clones) == len(state) == 4  # float32 on the CPU: .to() hands the model's own back
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value) and _storage(state[key]) != _storage(value)
    assert rank0_float32_state(model, precision, is_main=False) == {}


def test_gathered_tensors_are_kept_and_live_or_repeated_ones_copied(clones: list[int]) -> None:
    gathered, live, tied = torch.ones(3), torch.zeros(2), torch.arange(4.0)
    state = {"gathered": gathered, "live": live, "wte": tied, "lm_head": tied, "step": 3}
    copies = float32_cpu_copies(state, {_storage(live)})
    assert not state  # emptied as it went
    assert list(copies) == ["gathered", "live", "wte", "lm_head"]
    # fresh: not copied
    assert _storage(copies["gathered"]) == _storage(gathered) and _storage(
        copies["wte"]
    ) == _storage(tied)
    assert _storage(copies["live"]) != _storage(live) and torch.equal(copies["live"], live)
    assert _storage(copies["lm_head"]) != _storage(tied) and torch.equal(copies["lm_head"], tied)
    assert len(clones) == 2


def test_the_merge_copies_only_the_adapted_weights() -> None:
    config = ace3.TrainingConfig(lora=ace3.LoRAConfig(r=2, lora_alpha=4, target_modules=["0"]))
    adapters = apply_lora(_mlp(), config)
    assert adapters is not None
    whole = whole_weights(adapters, resolve_precision(config, torch.device("cpu")), True)
    merged = merge_weights(adapters, whole)
    assert sorted(merged) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert (
        merged["2.weight"] is whole["2.weight"] and merged["0.bias"] is whole["0.base_layer.bias"]
    )
    assert _storage(merged["0.weight"]) != _storage(whole["0.base_layer.weight"])
