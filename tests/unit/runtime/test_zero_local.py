"""ZeRO in an in-process run (one process): the caller's module stays a plain module and gets
the trained weights; sharded checkpoints are written, found and resumed; bad archives are
refused."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import torch
from torch import nn

import ace3
from ace3.config.checkpoint_names import CHECKPOINT_NAME_RE
from ace3.runtime.checkpoint.archive import read_train_state
from ace3.runtime.checkpoint.files import load_checkpoint


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(320, 16, generator=generator)
    targets = (inputs[:, :4].argmax(dim=1)).long()
    return inputs, targets


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _train(module: nn.Module, save_dir: Path | None, resume: bool = False, **fields):
    config = ace3.TrainingConfig(
        epochs=1, batch_size=32, learning_rate=0.01, validation_split=0.2, log_interval=1,
        **fields,
    )  # fmt: skip
    checkpoints = ace3.CheckpointConfig(save_dir=str(save_dir)) if save_dir else None
    return ace3.Trainer(config, checkpoint_config=checkpoints).train(module, _data(), resume=resume)


def test_zero_3_in_process_trains_the_callers_module_and_resumes(tmp_path: Path) -> None:
    plain = _model()
    expected = _train(plain, None, zero_stage=0, max_steps=6)
    module = _model()
    first = _train(module, tmp_path / "ckpt", zero_stage=3, max_steps=4)
    # The caller's module is still a plain module (FSDP sharded a copy) with trained weights.
    assert type(module) is nn.Sequential
    assert all(type(p) is nn.Parameter for p in module.parameters())
    assert first.model is module
    assert [p.name for p in first.checkpoints] == ["step-00000004.dcp.tar"]
    assert CHECKPOINT_NAME_RE.match("step-00000004.dcp.tar")
    state = load_checkpoint(first.checkpoints[0])
    assert (state["step"], state["world_size"], state["zero_stage"]) == (4, 1, 3)
    # A new module resumes from the newest checkpoint of save_dir and ends where an
    # uninterrupted (plain, zero_stage=0) run ends.
    resumed_module = _model()
    resumed = _train(resumed_module, tmp_path / "ckpt", resume=True, zero_stage=3, max_steps=6)
    assert [step for step, _ in resumed.history["train_loss"]] == [5, 6]
    for (step, got), (_, want) in zip(
        resumed.history["train_loss"], expected.history["train_loss"][4:], strict=True
    ):
        assert got == pytest.approx(want, rel=1e-5), step
    for got, want in zip(resumed_module.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def _archive(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_tar_that_is_not_a_sharded_checkpoint_is_refused(tmp_path: Path) -> None:
    escaping = _archive(tmp_path / "a.dcp.tar", {"../evil": b"x", "train_state.pt": b""})
    with pytest.raises(ValueError, match="not a plain file at the top level"):
        load_checkpoint(escaping)
    incomplete = _archive(tmp_path / "b.dcp.tar", {"train_state.pt": b""})
    with pytest.raises(ValueError, match=r"lacks train_state\.pt or the DCP \.metadata"):
        read_train_state(incomplete)
    buffer = io.BytesIO()
    torch.save({"format": 1}, buffer)
    wrong = _archive(
        tmp_path / "c.dcp.tar", {"train_state.pt": buffer.getvalue(), ".metadata": b""}
    )
    with pytest.raises(ValueError, match="not an ACE3 sharded train state"):
        load_checkpoint(wrong)


def test_model_checkpoint_callbacks_under_zero_2(tmp_path: Path) -> None:
    """Weights only: gathered into one plain state dict; a full checkpoint: the sharded
    archive (whatever the file is called), which resumes."""
    module = _model()
    callbacks = [
        ace3.callbacks.ModelCheckpoint(
            str(tmp_path / "weights-{epoch}.pt"), save_weights_only=True
        ),
        ace3.callbacks.ModelCheckpoint(str(tmp_path / "full-{epoch}.pt")),
    ]
    config = ace3.TrainingConfig(
        epochs=2, batch_size=32, validation_split=0.2, zero_stage=2, mixed_precision=True
    )
    ace3.Trainer(config, callbacks=callbacks).train(module, _data())
    weights = torch.load(tmp_path / "weights-2.pt", weights_only=True)
    assert set(weights) == set(module.state_dict())
    for name, value in module.state_dict().items():
        torch.testing.assert_close(weights[name], value)
    state = load_checkpoint(tmp_path / "full-2.pt")
    assert (state["step"], state["epoch"], state["zero_stage"]) == (16, 1, 2)
    again = _model()
    trainer = ace3.Trainer(config.model_copy(update={"epochs": 3}))
    trainer.load_checkpoint(tmp_path / "full-2.pt")
    resumed = trainer.train(again, _data(), resume=True)
    assert resumed.final_metrics["steps"] == 24
    assert not list(tmp_path.glob(".*"))  # no staging or temporary files left behind


@pytest.mark.parametrize(("saved_at", "resumed_at"), [(0, 3), (0, 1), (3, 0), (1, 2)])
def test_checkpoints_resume_across_stages(tmp_path: Path, saved_at: int, resumed_at: int) -> None:
    """A plain checkpoint resumes a ZeRO job (sharded on load) and a sharded one resumes at
    any stage, plain DDP included: the curve continues as if never interrupted."""
    expected = _train(_model(), None, max_steps=6)
    _train(_model(), tmp_path, zero_stage=saved_at, max_steps=3)
    suffix = ".pt" if saved_at == 0 else ".dcp.tar"
    assert [p.name for p in tmp_path.iterdir()] == [f"step-00000003{suffix}"]
    module = _model()
    resumed = _train(module, tmp_path, resume=True, zero_stage=resumed_at, max_steps=6)
    assert [step for step, _ in resumed.history["train_loss"]] == [4, 5, 6]
    for (_, got), (_, want) in zip(
        resumed.history["train_loss"], expected.history["train_loss"][3:], strict=True
    ):
        assert got == pytest.approx(want, rel=1e-5)
    for got, want in zip(module.parameters(), expected.model.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_sharded_checkpoint_consolidates_into_plain_weights(tmp_path: Path) -> None:
    from ace3.runtime.checkpoint.sharded import consolidate

    module = _model()
    result = _train(module, tmp_path, zero_stage=3, max_steps=2)
    full = consolidate(result.checkpoints[0])
    assert (full["step"], full["format"]) == (2, 2)
    for name, value in module.state_dict().items():
        torch.testing.assert_close(full["model"][name], value)
    assert set(full["optimizer"]["state"]) == {name for name, _ in module.named_parameters()}


def test_float16_loss_scaling_and_clipping_on_sharded_gradients() -> None:
    """The loss scaler unscales and checks FSDP's DTensor gradients, and clipping takes their
    global norm: the same curve as plain DDP."""
    fields = dict(
        mixed_precision=True, amp_dtype="float16", max_grad_norm=0.5, max_steps=5,
        gradient_accumulation_steps=2,
    )  # fmt: skip
    plain = _train(_model(), None, **fields)
    sharded = _train(_model(), None, zero_stage=2, **fields)
    assert sharded.final_metrics["skipped_steps"] == plain.final_metrics["skipped_steps"]
    for (_, got), (_, want) in zip(
        sharded.history["train_loss"], plain.history["train_loss"], strict=True
    ):
        assert got == pytest.approx(want, rel=1e-4)
