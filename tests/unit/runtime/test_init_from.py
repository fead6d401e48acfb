"""``init_from``: an in-process run starts from the weights of a checkpoint file (an ACE3
checkpoint, a plain state dict, a safetensors file), with a fresh optimizer at step 0; files
that do not fit the model, or that would run pickled code, are refused."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import TensorDataset

import ace3
from ace3.runtime.techniques.initial_weights import load_initial_weights, read_weights

_inputs = torch.linspace(-1.0, 1.0, 256).reshape(64, 4)
DATA = TensorDataset(_inputs, (_inputs.sum(dim=1) > 0).long())
BASE = {"batch_size": 16, "validation_split": 0.25, "learning_rate": 0.05, "seed": 0}


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))


def _pretrained(tmp_path: Path) -> tuple[Path, dict[str, float]]:
    torch.manual_seed(0)
    model = _net()
    save_dir = tmp_path / "pretrain"
    result = ace3.Trainer(
        ace3.TrainingConfig(**BASE, epochs=4),
        checkpoint_config=ace3.CheckpointConfig(save_dir=str(save_dir)),
    ).train(model, DATA)
    return sorted(save_dir.glob("step-*.pt"))[-1], dict(result.final_metrics)


def test_a_run_starts_from_the_checkpoint_weights_with_a_fresh_optimizer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint, pretrained = _pretrained(tmp_path)
    torch.manual_seed(123)  # other initial weights: only init_from can bring them back
    model = _net()
    tiny = {**BASE, "learning_rate": 1e-9, "epochs": 1, "max_steps": 1}
    result = ace3.Trainer(ace3.TrainingConfig(**tiny, init_from=checkpoint)).train(model, DATA)
    assert result.final_metrics["steps"] == 1  # step 0 + one step: not a resume
    assert result.final_metrics["val_loss"] == pytest.approx(pretrained["val_loss"], abs=1e-4)
    assert "initialised from step-" in capsys.readouterr().out

    torch.manual_seed(123)
    scratch = ace3.Trainer(ace3.TrainingConfig(**tiny)).train(_net(), DATA)
    assert scratch.final_metrics["val_loss"] > pretrained["val_loss"] + 0.05


@pytest.mark.parametrize("kind", ["state_dict", "safetensors"])
def test_plain_state_dicts_and_safetensors_load(tmp_path: Path, kind: str) -> None:
    torch.manual_seed(1)
    source = _net()
    weights = source.state_dict()
    path = tmp_path / ("w.pt" if kind == "state_dict" else "w.safetensors")
    if kind == "state_dict":
        torch.save(weights, path)
    else:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(path))
    torch.manual_seed(2)
    target = _net()
    load_initial_weights(target, read_weights(path), path.name)
    for name, value in target.state_dict().items():
        assert torch.equal(value, weights[name]), name


class _Payload:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (print, ("pickled code ran",))


def test_files_that_need_pickled_code_or_do_not_fit_are_refused(tmp_path: Path) -> None:
    pickled = tmp_path / "evil.pt"
    torch.save({"model": {"0.weight": _Payload()}}, pickled)
    with pytest.raises(ValueError, match="loads without running code"):
        read_weights(pickled)

    other = tmp_path / "other.pt"
    torch.save(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).state_dict(), other)
    with pytest.raises(ValueError, match=r"shapes differ: 0\.weight \(8, 4\)"):
        load_initial_weights(_net(), read_weights(other), other.name)
    extra = tmp_path / "extra.pt"
    torch.save({**_net().state_dict(), "head.weight": torch.zeros(1)}, extra)
    with pytest.raises(ValueError, match=r"not in the model: head\.weight"):
        load_initial_weights(_net(), read_weights(extra), extra.name)
    with pytest.raises(FileNotFoundError, match="init_from: no checkpoint file"):
        ace3.Trainer(ace3.TrainingConfig(**BASE, init_from=tmp_path / "missing.pt")).train(
            _net(), DATA
        )


def test_the_config_sends_stored_checkpoints_as_ids_and_never_a_local_path() -> None:
    checkpoint_id = "0123456789abcdef0123456789abcdef"
    by_id = ace3.TrainingConfig(init_from=checkpoint_id)
    assert by_id.init_from_checkpoint_id == checkpoint_id and by_id.init_from is None

    class Handle:
        id = checkpoint_id

    assert ace3.TrainingConfig(init_from=Handle()).init_from_checkpoint_id == checkpoint_id
    local = ace3.TrainingConfig(init_from=Path("weights/model.pt"))
    assert local.init_from == "weights/model.pt"
    assert ace3.TrainingConfig(**local.model_dump()).init_from == local.init_from
    with pytest.raises(pydantic.ValidationError, match="init_from_checkpoint_id"):
        ace3.TrainingConfig(init_from_checkpoint_id="../../etc/passwd")
    with pytest.raises(pydantic.ValidationError, match="set one of them"):
        ace3.TrainingConfig(init_from=checkpoint_id, init_from_checkpoint_id="f" * 32)
    with pytest.raises(pydantic.ValidationError, match="not int"):
        ace3.TrainingConfig(init_from=3)
