"""Callbacks inside the engine: CallbackHook driven through a HookList by a small real loop
(a tiny model, a real optimizer and schedule, a RunContext as the trainer builds it), with
scripted validation metrics so every decision is known in advance."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import ace3.training.callbacks as callbacks_module
from ace3.config import TrainingConfig
from ace3.runtime.loop.hooks import HookList, RunContext
from ace3.runtime.observe.callback_hook import CallbackHook
from ace3.training.callbacks import (
    Callback,
    CallbackError,
    EarlyStopping,
    ModelCheckpoint,
    ReduceLROnPlateau,
)

BATCHES_PER_EPOCH = 3


def make_run(
    tmp_path: Path,
    *,
    epochs: int = 6,
    lr: float = 0.1,
    rank: int = 0,
    scheduler: bool = False,
) -> RunContext:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0) if scheduler else None

    def save_model(path: Path, weights_only: bool) -> None:
        if rank != 0:
            return
        if weights_only:
            torch.save(model.state_dict(), path)
        else:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)

    return RunContext(
        model=model,
        optimizer=optimizer,
        config=TrainingConfig(epochs=epochs, batch_size=8),
        rank=rank,
        world_size=2 if rank else 1,
        device=torch.device("cpu"),
        output_dir=tmp_path / "out",
        scheduler=sched,
        save_model=save_model,
    )


class Record:
    def __init__(self) -> None:
        self.epochs_ended: list[int] = []
        self.steps = 0
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.lrs: list[float] = []


def drive(
    run: RunContext,
    hooks: HookList,
    val_losses: Sequence[float],
    val_accuracies: Sequence[float] | None = None,
) -> Record:
    """The trainer's hook protocol (see ace3.runtime.loop.hooks) around real SGD steps."""
    model, optimizer = run.model, run.optimizer
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    y = torch.arange(8) % 3
    record = Record()
    hooks.bind(run)
    try:
        hooks.on_train_begin()
        for epoch in range(1, run.config.epochs + 1):
            hooks.on_epoch_begin(epoch)
            stopped = False
            for batch in range(BATCHES_PER_EPOCH):
                hooks.on_batch_begin(batch)
                optimizer.zero_grad()
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                if run.scheduler is not None:
                    run.scheduler.step()
                record.steps += 1
                logs = {}
                if hooks.wants_batch_logs:
                    logs = {
                        "loss": float(loss.detach()),
                        "step": float(record.steps),
                        "learning_rate": optimizer.param_groups[0]["lr"],
                        "batch_size": 8.0,
                    }
                hooks.on_batch_end(batch, logs)
                if hooks.checks_stop_every_batch and hooks.wants_stop():
                    stopped = True
                    break
            if stopped:
                break
            record.weights[epoch] = {k: v.clone() for k, v in model.state_dict().items()}
            logs = {"epoch_train_loss": 1.0, "train_loss": 1.0, "val_loss": val_losses[epoch - 1]}
            if val_accuracies is not None:
                logs["val_accuracy"] = val_accuracies[epoch - 1]
            hooks.on_epoch_end(epoch, logs)
            record.epochs_ended.append(epoch)
            record.lrs.append(optimizer.param_groups[0]["lr"])
            if hooks.wants_stop():
                break
        hooks.on_train_end({"train_loss": 1.0, "steps": float(record.steps)})
    finally:
        hooks.close()
    return record


def same_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(value, weights[key]) for key, value in model.state_dict().items())


# -- EarlyStopping ------------------------------------------------------------------------------


def test_early_stopping_stops_after_patience_and_restores_the_best_weights(tmp_path, capsys):
    run = make_run(tmp_path)
    stopper = EarlyStopping(
        monitor="val_loss", patience=2, min_delta=0.001, restore_best_weights=True
    )
    record = drive(run, HookList([CallbackHook([stopper])]), [1.0, 0.5, 0.6, 0.7, 0.4, 0.3])
    assert record.epochs_ended == [1, 2, 3, 4]  # epochs 3 and 4 did not improve on epoch 2
    assert stopper.stopped_epoch == 4 and stopper.best_epoch == 2 and stopper.best == 0.5
    assert run.model.stop_training is True
    assert same_weights(run.model, record.weights[2])
    assert not same_weights(run.model, record.weights[4])
    assert stopper.best_weights is None  # the CPU copy is dropped once loaded
    output = capsys.readouterr().out
    assert "Epoch 4: early stopping" in output and "restored the weights of epoch 2" in output


def test_early_stopping_restores_at_the_last_planned_epoch_after_the_others_saw_it(tmp_path):
    run = make_run(tmp_path, epochs=3)
    stopper = EarlyStopping(patience=5, restore_best_weights=True, verbose=False)
    every_epoch = ModelCheckpoint(
        str(tmp_path / "e{epoch}.pt"), save_weights_only=True, verbose=False
    )
    record = drive(run, HookList([CallbackHook([stopper, every_epoch])]), [0.9, 0.2, 0.8])
    assert record.epochs_ended == [1, 2, 3] and stopper.stopped_epoch == 0
    assert same_weights(run.model, record.weights[2])  # restored before the final checkpoint
    # ModelCheckpoint, listed after EarlyStopping, still saved epoch 3's own weights.
    assert same_weights(run.model, torch.load(tmp_path / "e2.pt", weights_only=True))
    saved = torch.load(tmp_path / "e3.pt", weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in record.weights[3].items())


def test_early_stopping_restores_when_another_callback_stops(tmp_path, capsys):
    class StopAtThree(Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 3:
                self.model.stop_training = True

    run = make_run(tmp_path)
    stopper = EarlyStopping(patience=5, restore_best_weights=True)
    record = drive(run, HookList([CallbackHook([stopper, StopAtThree()])]), [0.9, 0.2, 0.8] * 2)
    assert record.epochs_ended == [1, 2, 3]
    assert same_weights(run.model, record.weights[2])
    assert "restored the weights of epoch 2 (val_loss=0.2)" in capsys.readouterr().out


def test_early_stopping_min_delta_and_auto_mode_for_accuracy(tmp_path):
    run = make_run(tmp_path)
    small_gains = EarlyStopping(patience=1, min_delta=0.01, verbose=False)
    assert drive(
        run, HookList([CallbackHook([small_gains])]), [1.0, 0.995, 0.99] * 2
    ).epochs_ended == [1, 2]

    run = make_run(tmp_path)
    accuracy = EarlyStopping(monitor="val_accuracy", patience=1, verbose=False)
    record = drive(
        run, HookList([CallbackHook([accuracy])]), [1.0] * 6, [0.5, 0.6, 0.7, 0.65, 0.9, 0.9]
    )
    assert record.epochs_ended == [1, 2, 3, 4]  # higher is better: 0.65 is the first drop


def test_a_missing_monitored_metric_warns_once_and_does_not_stop(tmp_path):
    run = make_run(tmp_path, epochs=4)
    stopper = EarlyStopping(monitor="val_los", patience=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = drive(run, HookList([CallbackHook([stopper])]), [1.0] * 4)
    assert record.epochs_ended == [1, 2, 3, 4]
    messages = [str(w.message) for w in caught if "val_los'" in str(w.message)]
    assert len(messages) == 1
    assert "available: epoch_train_loss, train_loss, val_loss" in messages[0]


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: EarlyStopping(patience=-1), "patience"),
        (lambda: EarlyStopping(patience=2.5), "patience"),
        (lambda: EarlyStopping(min_delta=-0.1), "min_delta"),
        (lambda: EarlyStopping(mode="lowest"), "mode"),
        (lambda: EarlyStopping(monitor=""), "monitor"),
        (lambda: EarlyStopping(restore_best_weights="yes"), "restore_best_weights"),
        (lambda: ReduceLROnPlateau(factor=1.5), "factor"),
        (lambda: ReduceLROnPlateau(factor=0), "factor"),
        (lambda: ReduceLROnPlateau(min_lr=-1), "min_lr"),
        (lambda: ReduceLROnPlateau(cooldown=-1), "cooldown"),
        (lambda: ModelCheckpoint(""), "filepath"),
        (lambda: ModelCheckpoint("model-{}.pt"), "filepath"),
        (lambda: ModelCheckpoint("model-{logs.val}.pt"), "filepath"),
        (lambda: ModelCheckpoint("model-{val_loss:d}.pt"), "filepath"),
        (lambda: ModelCheckpoint("model-{epoch.pt"), "filepath"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(make, named):
    with pytest.raises(CallbackError, match=rf"\({named}=\.\.\.\)"):
        make()


# -- ModelCheckpoint ----------------------------------------------------------------------------


def test_model_checkpoint_template_and_save_best_only(tmp_path):
    run = make_run(tmp_path, epochs=4)
    template = str(tmp_path / "ckpt" / "model-{epoch:02d}-{val_loss:.2f}.pt")
    checkpoint = ModelCheckpoint(
        template, save_best_only=True, save_weights_only=True, verbose=False
    )
    record = drive(run, HookList([CallbackHook([checkpoint])]), [0.9, 0.5, 0.7, 0.4])
    assert record.epochs_ended == [1, 2, 3, 4]
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == ["model-01-0.90.pt", "model-02-0.50.pt", "model-04-0.40.pt"]
    weights = torch.load(tmp_path / "ckpt" / "model-04-0.40.pt", weights_only=True)
    assert set(weights) == set(run.model.state_dict())
    assert same_weights(run.model, weights)  # the last save is the current model


def test_model_checkpoint_every_epoch_full_checkpoint_under_artifacts(tmp_path):
    run = make_run(tmp_path, epochs=2)
    checkpoint = ModelCheckpoint("artifact://mc/e{epoch}.pt", verbose=False)
    drive(run, HookList([CallbackHook([checkpoint])]), [0.9, 0.95])
    folder = tmp_path / "out" / "artifacts" / "mc"
    assert sorted(p.name for p in folder.iterdir()) == ["e1.pt", "e2.pt"]
    payload = torch.load(folder / "e2.pt", weights_only=True)
    assert set(payload) == {"model", "optimizer"}  # save_weights_only=False: the full state


def test_model_checkpoint_names_a_template_key_the_logs_lack(tmp_path):
    run = make_run(tmp_path, epochs=1)
    checkpoint = ModelCheckpoint(str(tmp_path / "m-{val_f1:.2f}.pt"), verbose=False)
    with pytest.raises(CallbackError, match=r"\['val_f1'\].*available: .*val_loss"):
        drive(run, HookList([CallbackHook([checkpoint])]), [0.5])


# -- ReduceLROnPlateau --------------------------------------------------------------------------


def test_reduce_lr_on_plateau_scales_groups_and_the_schedule_base(tmp_path, capsys):
    run = make_run(tmp_path, epochs=6, lr=0.1, scheduler=True)
    reducer = ReduceLROnPlateau(factor=0.5, patience=1, min_lr=0.02)
    record = drive(run, HookList([CallbackHook([reducer])]), [1.0] * 6)
    # epoch 1 sets the best; each later epoch without improvement reduces (patience 1).
    assert record.lrs == pytest.approx([0.1, 0.05, 0.025, 0.02, 0.02, 0.02])
    # The per-step schedule kept the reduced rate across its steps: base_lrs were scaled too.
    assert run.scheduler.base_lrs == pytest.approx([0.02])
    assert "learning rate reduced to 0.05" in capsys.readouterr().out


def test_reduce_lr_on_plateau_cooldown_and_improvement(tmp_path):
    run = make_run(tmp_path, epochs=6, lr=0.1)
    reducer = ReduceLROnPlateau(factor=0.1, patience=1, cooldown=2, min_delta=0.0, verbose=False)
    record = drive(run, HookList([CallbackHook([reducer])]), [1.0, 1.0, 1.0, 1.0, 0.5, 0.5])
    # reduced at epoch 2, cooling down at 3 and 4, 0.5 improves at 5, then 6 reduces again.
    assert record.lrs == pytest.approx([0.1, 0.01, 0.01, 0.01, 0.01, 0.001])


# -- user callbacks -----------------------------------------------------------------------------


class CustomCallback(Callback):  # the document's example, as written
    def on_epoch_begin(self, epoch, logs=None):
        print(f"Starting epoch {epoch}")

    def on_epoch_end(self, epoch, logs=None):
        val_acc = logs.get("val_accuracy", 0)
        if val_acc > 0.95:
            print("Target accuracy reached!")
            self.model.stop_training = True

    def on_batch_end(self, batch, logs=None):
        if batch % 100 == 0:
            print(f"Processed batch {batch}")


def test_the_documents_custom_callback_prints_and_stops(tmp_path, capsys):
    run = make_run(tmp_path)
    callback = CustomCallback()
    hook = CallbackHook([callback])
    assert hook.checks_stop_every_batch and hook.wants_batch_logs  # it overrides on_batch_end
    record = drive(run, HookList([hook]), [1.0] * 6, [0.5, 0.97, 0.99, 0.99, 0.99, 0.99])
    assert record.epochs_ended == [1, 2]
    assert callback.model is run.model
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "Starting epoch 1",
        "Processed batch 0",
        "Starting epoch 2",
        "Processed batch 0",
        "Target accuracy reached!",
    ]


class StopAtSecondBatch(Callback):
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def on_batch_end(self, batch, logs=None):
        self.seen.append(dict(logs))
        if batch == 1:
            self.model.stop_training = True


def test_stopping_in_a_batch_hook_stops_after_that_batch(tmp_path):
    run = make_run(tmp_path)
    callback = StopAtSecondBatch()
    record = drive(run, HookList([CallbackHook([callback])]), [1.0] * 6)
    assert record.steps == 2 and record.epochs_ended == []
    assert [logs["step"] for logs in callback.seen] == [1.0, 2.0]
    assert set(callback.seen[0]) == {"loss", "step", "learning_rate", "batch_size"}


def test_epoch_only_callbacks_do_not_ask_for_per_step_work():
    hook = CallbackHook([EarlyStopping(), ReduceLROnPlateau()])
    assert not hook.checks_stop_every_batch and not hook.wants_batch_logs

    class BeginOnly(Callback):
        def on_batch_begin(self, batch, logs=None):
            pass

    hook = CallbackHook([BeginOnly()])
    assert hook.checks_stop_every_batch and not hook.wants_batch_logs


def test_other_ranks_run_callbacks_silently(tmp_path, capsys):
    run = make_run(tmp_path, rank=1)
    record = drive(run, HookList([CallbackHook([CustomCallback()])]), [1.0] * 6, [0.99] * 6)
    assert record.epochs_ended == [1]  # the same decision as rank 0 ...
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""  # ... without the output


def test_hook_refuses_what_is_not_a_callback():
    with pytest.raises(CallbackError, match=r"callbacks\[1\] must be an ace3.Callback"):
        CallbackHook([EarlyStopping(), lambda epoch: None])  # type: ignore[list-item]


def test_callbacks_module_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, ace3.training.callbacks, ace3.training.callbacks.transport, ace3.training.loggers\n"
        "assert 'torch' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert callbacks_module.BUILTIN_CALLBACKS["EarlyStopping"] is EarlyStopping
