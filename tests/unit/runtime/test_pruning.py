"""``pruning``: the schedule, the final global sparsity (within 1 point of the target), the
accuracy drop in the summary, plain weight names in every checkpoint and in the model, a
bit-identical resume from a checkpoint written mid-pruning, and the refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import ace3
from ace3.runtime.process.distributed import DistContext
from ace3.runtime.techniques.pruning import Pruner, scheduled_sparsity

BASE: dict[str, Any] = {"epochs": 3, "batch_size": 64, "learning_rate": 1e-2, "seed": 0,
                        "log_interval": 10}  # fmt: skip


@pytest.fixture(scope="module")
def digits() -> tuple[TensorDataset, TensorDataset]:
    data = load_digits()
    inputs = torch.tensor(data.data / 16.0, dtype=torch.float32)
    targets = torch.tensor(data.target, dtype=torch.int64)
    return TensorDataset(inputs[:1400], targets[:1400]), TensorDataset(
        inputs[1400:], targets[1400:]
    )


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 10))  # fmt: skip


def weights(model: nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if isinstance(m, nn.Linear)]


def zero_share(tensors: list[torch.Tensor]) -> float:
    return sum(int((t == 0).sum()) for t in tensors) / sum(t.numel() for t in tensors)


def run(model: nn.Module, digits: Any, tmp: Path | None, **pruning: Any) -> Any:
    config = ace3.TrainingConfig(**BASE, pruning=ace3.PruningConfig(**pruning))
    saving = ace3.CheckpointConfig(save_dir=str(tmp), save_interval=20) if tmp else None
    return ace3.Trainer(config, checkpoint_config=saving).train(
        model, digits[0], validation_dataset=digits[1]
    )


def test_the_schedules_rise_from_begin_to_end() -> None:
    cubic = ace3.PruningConfig(target_sparsity=0.8, begin_step=10, end_step=110)
    values = [scheduled_sparsity(cubic, step, 110) for step in (0, 9, 10, 60, 110, 200)]
    assert values == [0.0, 0.0, 0.0, pytest.approx(0.8 - 0.8 * 0.5**3), 0.8, 0.8]
    linear = cubic.model_copy(update={"schedule": "linear", "initial_sparsity": 0.2})
    assert scheduled_sparsity(linear, 60, 110) == pytest.approx(0.5)
    oneshot = ace3.PruningConfig(target_sparsity=0.3, schedule="oneshot", begin_step=5)
    assert [scheduled_sparsity(oneshot, s, 5) for s in (4, 5, 9)] == [0.0, 0.3, 0.3]


def test_global_pruning_reaches_the_target_and_reports_the_drop(
    digits: Any, tmp_path: Path
) -> None:
    model = mlp()
    result = run(model, digits, tmp_path, target_sparsity=0.6, begin_step=10, frequency=5)
    final = result.final_metrics
    assert abs(final["sparsity"] - 0.6) <= 0.01
    # The model the caller holds: plain weights, the same sparsity.
    assert not any("weight_orig" in name or "mask" in name for name in model.state_dict())
    assert abs(zero_share(weights(model)) - 0.6) <= 0.01
    # The drop is the dense validation just before the first pruning vs the final one.
    assert final["pruning_accuracy_drop"] == pytest.approx(
        final["dense_val_accuracy"] - final["val_accuracy"]
    )
    assert final["val_accuracy"] > 0.8
    ((dense_step, _),) = result.history["dense_val_accuracy"]
    sparsities = result.history["sparsity"]
    assert dense_step == sparsities[0][0] == 15  # step 10 asks for sparsity 0: nothing pruned
    assert [s for _, s in sparsities] == sorted(s for _, s in sparsities)
    # Every checkpoint holds plain names, with the pruned weights at zero.
    for path in result.checkpoints:
        state = torch.load(path, weights_only=True)["model"]
        assert set(state) == set(model.state_dict()), path.name
    last = torch.load(result.checkpoints[-1], weights_only=True)["model"]
    assert all(torch.equal(last[k], v) for k, v in model.state_dict().items())


def test_layer_scope_prunes_each_layer_to_the_target(digits: Any) -> None:
    model = mlp()
    run(model, digits, None, target_sparsity=0.5, schedule="oneshot", begin_step=30, scope="layer",
        target_modules=["0", "2"])  # fmt: skip
    first, second, head = weights(model)
    assert zero_share([first]) == zero_share([second]) == 0.5
    assert zero_share([head]) == 0.0


def test_a_resume_mid_pruning_is_bit_identical(digits: Any, tmp_path: Path) -> None:
    whole = mlp()
    fields = {"target_sparsity": 0.7, "begin_step": 5, "end_step": 50, "frequency": 5}
    result = run(whole, digits, tmp_path / "whole", **fields)
    middle = tmp_path / "whole" / "step-00000040.pt"
    assert 0 < dict(result.history["sparsity"])[40] < 0.7  # written while pruning
    resumed = mlp(seed=7)
    trainer = ace3.Trainer(
        ace3.TrainingConfig(**BASE, pruning=ace3.PruningConfig(**fields)),
        checkpoint_config=ace3.CheckpointConfig(save_dir=str(tmp_path / "again"), save_interval=20),
    )
    trainer.load_checkpoint(middle)
    again = trainer.train(resumed, digits[0], validation_dataset=digits[1], resume=True)
    for (name, a), (_, b) in zip(
        whole.state_dict().items(), resumed.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    for key in ("sparsity", "dense_val_accuracy", "pruning_accuracy_drop"):
        assert again.final_metrics[key] == result.final_metrics[key], key


def test_bad_settings_are_refused_with_the_field() -> None:
    ctx = DistContext(
        rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo"
    )
    with pytest.raises(ValueError, match=r"pruning.target_modules: the pattern 'enc\*' matches"):
        Pruner(ace3.PruningConfig(target_sparsity=0.5, target_modules=["enc*"]), mlp(), ctx, 100)
    with pytest.raises(ValueError, match=r"pruning.end_step=500 is after the run's last step"):
        Pruner(ace3.PruningConfig(target_sparsity=0.5, end_step=500), mlp(), ctx, 100)
    with pytest.raises(pydantic.ValidationError, match="end_step is not used by"):
        ace3.PruningConfig(target_sparsity=0.5, schedule="oneshot", end_step=9)
    with pytest.raises(pydantic.ValidationError, match="target_sparsity"):
        ace3.PruningConfig(target_sparsity=1.0)
    pruning = ace3.PruningConfig(target_sparsity=0.5)
    for fields in ({"num_gpus": 2, "zero_stage": 3}, {"num_gpus": 2, "parallelism": "pipeline"},
                   {"mixed_precision": True, "amp_level": "O2"}):  # fmt: skip
        problems = ace3.unsupported_settings(ace3.TrainingConfig(**fields, pruning=pruning))
        assert [p.field for p in problems] == ["pruning"], fields
    assert (
        ace3.unsupported_settings(ace3.TrainingConfig(num_gpus=2, zero_stage=1, pruning=pruning))
        == []
    )
