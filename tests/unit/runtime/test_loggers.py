"""Loggers: TrainingLogger files and console lines, TensorBoard event files read back with
TensorBoard's own reader, W&B offline for real (its run file read back), and the errors for a
missing package or configuration."""

from __future__ import annotations

import json
import struct
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ace3.config import TrainingConfig
from ace3.config.specs import TensorBoardSpec
from ace3.runtime.loop.hooks import HookList, RunContext
from ace3.runtime.observe.logger_hooks import LoggerMetricsHook
from ace3.runtime.observe.tensorboard_hook import TensorBoardHook, image_grid
from ace3.training.loggers import (
    Logger,
    LoggerArgumentError,
    LoggerUnavailableError,
    TensorBoardLogger,
    TrainingLogger,
    WandBLogger,
)


def make_run(tmp_path: Path, model: nn.Module, batch: Any, rank: int = 0) -> RunContext:
    return RunContext(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        config=TrainingConfig(epochs=1, batch_size=8),
        rank=rank,
        world_size=2 if rank else 1,
        device=torch.device("cpu"),
        output_dir=tmp_path / "out",
        example_batch=batch,
    )


def digits_like_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Flat 64-feature inputs, as scikit-learn's digits (8x8 images)."""
    generator = torch.Generator().manual_seed(0)
    return torch.rand(8, 64, generator=generator) * 16, torch.arange(8) % 10


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 10))


# -- TrainingLogger -----------------------------------------------------------------------------


def test_training_logger_sets_the_config_fields_and_checkpoint_dir(tmp_path):
    plain = TrainingLogger(log_dir=tmp_path / "logs", log_interval=100)
    assert plain.training_fields() == {"log_interval": 100}
    assert plain.checkpoint_dir() is None
    saving = TrainingLogger(
        log_dir=tmp_path / "logs", log_interval=5, save_checkpoints=True, checkpoint_interval=1000
    )
    assert saving.training_fields() == {"log_interval": 5, "save_interval": 1000}
    assert saving.checkpoint_dir() == str((tmp_path / "logs" / "checkpoints").resolve())
    TrainingConfig(**saving.training_fields())  # valid config fields
    assert plain.engine_hooks(local=False) == []
    assert isinstance(plain.engine_hooks(local=True)[0], LoggerMetricsHook)


def test_training_logger_writes_jsonl_with_custom_metrics_and_prints(tmp_path, capsys):
    logger = TrainingLogger(log_dir=tmp_path / "logs", log_interval=1)
    calls = []
    logger.add_metric("custom_loss", lambda: calls.append(1) or 0.25)
    logger.add_metric("tensor_metric", lambda: torch.tensor(1.5))
    logger.start({"job_id": "job-1", "config": {}, "where": "remote"})
    logger.log_metrics(1, 1, {"train_loss": 2.0, "learning_rate": 0.1})
    logger.log_metrics(3, 1, {"val_loss": float("nan"), "val_accuracy": 0.5})
    logger.finish("succeeded")
    lines = [
        json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [line["step"] for line in lines] == [1, 3] and len(calls) == 2
    assert lines[0]["job_id"] == "job-1" and lines[0]["epoch"] == 1
    assert lines[0]["values"] == {
        "train_loss": 2.0,
        "learning_rate": 0.1,
        "custom_loss": 0.25,
        "tensor_metric": 1.5,
    }
    assert lines[1]["values"]["val_loss"] is None  # non-finite -> null, the line stays JSON
    out = capsys.readouterr().out
    assert "[TrainingLogger] step 1 epoch 1 train_loss=2 learning_rate=0.1 custom_loss=0.25" in out
    assert "succeeded: 2 metrics event(s)" in out


def test_in_process_runs_print_only_the_custom_metrics(tmp_path, capsys):
    logger = TrainingLogger(log_dir=tmp_path)
    logger.start({"job_id": None, "config": {}, "where": "local"})
    logger.log_metrics(1, 1, {"train_loss": 2.0})  # the engine printed this one already
    logger.add_metric("custom_loss", lambda: 0.5)
    logger.log_metrics(2, 1, {"train_loss": 1.0})
    logger.finish("succeeded")
    lines = [line for line in capsys.readouterr().out.splitlines() if "step" in line]
    assert lines == ["[TrainingLogger] step 2 epoch 1 custom_loss=0.5"]


def test_a_failing_custom_metric_warns_once_with_its_name(tmp_path):
    logger = TrainingLogger(log_dir=tmp_path, verbose=False)
    logger.add_metric("broken", lambda: 1 / 0)
    logger.add_metric("fine", lambda: 1.0)
    logger.start({})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log_metrics(1, 1, {"train_loss": 1.0})
        logger.log_metrics(2, 1, {"train_loss": 0.5})
    logger.finish("succeeded")
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "'broken' failed (ZeroDivisionError" in messages[0]
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["values"] == {"train_loss": 0.5, "fine": 1.0}


def test_training_logger_in_process_gets_rank_zeros_events_through_its_hook(tmp_path):
    for rank, expected in ((0, 1), (1, 0)):
        logger = TrainingLogger(log_dir=tmp_path / f"r{rank}", verbose=False)
        logger.start({})
        hooks = HookList(logger.engine_hooks(local=True))
        hooks.bind(make_run(tmp_path, small_model(), None, rank=rank))
        hooks.on_metrics(10, 1, {"train_loss": 1.0})
        logger.finish("succeeded")
        assert len((tmp_path / f"r{rank}" / "metrics.jsonl").read_text().splitlines()) == expected


def test_a_failing_logger_does_not_stop_training(tmp_path):
    class Broken(Logger):
        def log_metrics(self, step, epoch, values):
            raise OSError("disk full")

    hook = LoggerMetricsHook(Broken())
    hook.bind(make_run(tmp_path, small_model(), None))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hook.on_metrics(1, 1, {"train_loss": 1.0})
        hook.on_metrics(2, 1, {"train_loss": 1.0})
    assert hook.failures == 2
    assert [str(w.message) for w in caught] == [
        "Broken.log_metrics failed at step 1 (OSError: disk full); training goes on, and "
        "further failures of this logger are not reported"
    ]


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: TrainingLogger(log_interval=0), "log_interval"),
        (lambda: TrainingLogger(checkpoint_interval=-5), "checkpoint_interval"),
        (lambda: TrainingLogger(save_checkpoints="yes"), "save_checkpoints"),
        (lambda: TrainingLogger(log_dir=""), "log_dir"),
        (lambda: TensorBoardLogger(log_graph=1), "log_graph"),
        (lambda: TensorBoardLogger(log_dir=None), "log_dir"),
    ],
)
def test_bad_logger_arguments_are_refused_naming_them(make, named):
    with pytest.raises(LoggerArgumentError, match=rf"\({named}=\.\.\.\)"):
        make()


def test_add_metric_needs_a_name_and_a_callable():
    logger = TrainingLogger()
    with pytest.raises(LoggerArgumentError, match="name"):
        logger.add_metric("", lambda: 1.0)
    with pytest.raises(LoggerArgumentError, match="must be callable"):
        logger.add_metric("x", 3.0)  # type: ignore[arg-type]


# -- TensorBoard ---------------------------------------------------------------------------------


def read_events(directory: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(
        str(directory), size_guidance={"scalars": 0, "histograms": 0, "images": 0}
    )
    accumulator.Reload()
    return accumulator


def test_tensorboard_logger_settings():
    logger = TensorBoardLogger(log_dir="./tb", log_graph=True, log_histograms=True)
    spec = logger.training_fields()["tensorboard"]
    assert isinstance(spec, TensorBoardSpec) and Path(spec.log_dir).is_absolute()
    assert spec.log_graph and not spec.log_images and spec.log_histograms
    assert logger.artifact_dirs() == {"tensorboard": spec.log_dir}
    assert logger.engine_hooks(local=True) == []  # the engine builds the hook from the config
    TrainingConfig(**logger.training_fields())


def test_tensorboard_hook_writes_scalars_graph_images_and_histograms(tmp_path):
    model = small_model()
    run = make_run(tmp_path, model, digits_like_batch())
    spec = TensorBoardSpec(log_graph=True, log_images=True, log_histograms=True)
    hooks = HookList([TensorBoardHook(spec)])  # default log_dir: artifact://tensorboard
    rng_before = torch.get_rng_state()
    hooks.bind(run)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # graph and images must work for this model
        hooks.on_train_begin()
    assert torch.equal(torch.get_rng_state(), rng_before)  # tracing left the RNG alone
    assert model.training and all(m.training for m in model.modules())
    hooks.on_metrics(1, 1, {"train_loss": 2.0, "learning_rate": 0.1})
    hooks.on_metrics(4, 1, {"epoch_train_loss": 1.5, "val_loss": 1.2, "val_accuracy": 0.4})
    hooks.on_epoch_end(1, {"val_loss": 1.2})
    hooks.on_train_end({})
    hooks.close()

    folder = tmp_path / "out" / "artifacts" / "tensorboard"
    events = read_events(folder)
    tags = events.Tags()
    assert {"train_loss", "learning_rate", "val_loss", "val_accuracy"} <= set(tags["scalars"])
    assert [(e.step, e.value) for e in events.Scalars("val_loss")] == [(4, pytest.approx(1.2))]
    assert tags["images"] == ["inputs"]
    image = events.Images("inputs")[0]
    assert (image.width, image.height) == (8 * 8, 8)  # 8 digits of 8x8 pixels, in a row
    assert tags["graph"] is True
    assert {"weights/0.weight", "weights/0.bias", "weights/3.weight"} <= set(tags["histograms"])
    assert events.Histograms("weights/0.weight")[0].step == 4


def test_tensorboard_hook_writes_nothing_on_other_ranks(tmp_path):
    hook = TensorBoardHook(TensorBoardSpec(), log_dir=tmp_path / "tb")
    hook.bind(make_run(tmp_path, small_model(), digits_like_batch(), rank=1))
    hook.on_train_begin()
    hook.on_metrics(1, 1, {"train_loss": 1.0})
    hook.close()
    assert not (tmp_path / "tb").exists()


class Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(64, 10)

    def forward(self, x):
        return {"not", "a", "tensor"} if x.shape[0] > 0 else self.layer(x)


def test_an_untraceable_model_warns_and_goes_on(tmp_path):
    hook = TensorBoardHook(TensorBoardSpec(log_graph=True), log_dir=tmp_path / "tb")
    hook.bind(make_run(tmp_path, Untraceable(), digits_like_batch()))
    with pytest.warns(RuntimeWarning, match="could not be traced"):
        hook.on_train_begin()
    hook.on_metrics(1, 1, {"train_loss": 1.0})
    hook.close()
    assert read_events(tmp_path / "tb").Tags()["scalars"] == ["train_loss"]


def test_image_shapes():
    grid, how = image_grid(torch.rand(20, 3, 5, 6))
    assert grid.shape == (16, 3, 5, 6) and how == "N,C,H,W images"
    assert float(grid.min()) == 0.0 and float(grid.max()) == 1.0
    grid, how = image_grid(torch.rand(4, 7, 9))
    assert grid.shape == (4, 1, 7, 9)
    grid, how = image_grid(torch.rand(4, 64))
    assert grid.shape == (4, 1, 8, 8) and "8x8" in how
    grid, _ = image_grid(torch.full((2, 1, 3, 3), 255, dtype=torch.uint8))
    assert float(grid.max()) == 1.0
    assert image_grid(torch.rand(4, 10)) is None  # not a square
    assert image_grid(torch.randint(0, 100, (4, 64))) is None  # token ids, not pixels
    assert image_grid(torch.rand(4, 5, 2, 2)) is None  # 5 channels


def test_missing_tensorboard_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.delitem(sys.modules, "torch.utils.tensorboard", raising=False)
    with pytest.raises(LoggerUnavailableError, match=r"pip install 'ace3\[tensorboard\]'"):
        TensorBoardHook(TensorBoardSpec())


# -- Weights & Biases ---------------------------------------------------------------------------


def read_wandb_records(path: Path) -> list[Any]:
    """The records of a W&B run file (LevelDB log format: 32 KiB blocks of framed records)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, block, pending, records = 7, 32768, b"", []
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        payload = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind == 0:
            break
        pending = payload if kind in (1, 2) else pending + payload
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path) -> Path:
    pytest.importorskip("wandb")
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "config"),
        "WANDB_CACHE_DIR": str(tmp_path / "cache"),
        "WANDB_DATA_DIR": str(tmp_path / "data"),
    }.items():
        monkeypatch.setenv(name, value)
    return tmp_path


def test_wandb_logger_offline_run_holds_config_and_metrics(wandb_offline):
    import wandb

    logger = WandBLogger(
        project="my-project",
        name="experiment-1",
        config={"learning_rate": 1e-4, "batch_size": 32, "model": "resnet50"},
    )
    try:
        logger.start(
            {"job_id": "job-7", "config": {"epochs": 3, "batch_size": 64}, "where": "local"}
        )
        logger.log_metrics(1, 1, {"train_loss": 2.0})
        logger.log_metrics(5, 1, {"train_loss": 1.0, "val_loss": 0.9})
        logger.finish("succeeded")
    finally:
        wandb.teardown()
    (run_file,) = wandb_offline.glob("wandb/offline-run-*/run-*.wandb")
    records = read_wandb_records(run_file)
    config = {}
    history = []
    for record in records:
        kind = record.WhichOneof("record_type")
        if kind == "run":
            assert record.run.project == "my-project" and record.run.display_name == "experiment-1"
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            history.append((record.history.step.num, items))
        elif kind == "exit":
            assert record.exit.exit_code == 0
    # The user's config wins over the training config; the job id is recorded.
    assert config["batch_size"] == 32 and config["epochs"] == 3 and config["ace3_job_id"] == "job-7"
    assert [(step, items["train_loss"]) for step, items in history] == [(1, 2.0), (5, 1.0)]
    assert history[1][1]["val_loss"] == 0.9 and history[1][1]["epoch"] == 1


def test_wandb_without_the_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(LoggerUnavailableError, match=r"pip install 'ace3\[wandb\]'"):
        WandBLogger(project="p")


def test_wandb_without_configuration_says_what_to_do(monkeypatch, tmp_path):
    pytest.importorskip("wandb")
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "netrc").write_text("machine example.com login me password secret\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    with pytest.raises(LoggerUnavailableError, match="wandb login") as caught:
        WandBLogger(project="p")
    assert "WANDB_API_KEY" in str(caught.value) and "WANDB_MODE=offline" in str(caught.value)
    # Credentials in the netrc (what `wandb login` writes) are enough.
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password 0123456789abcdef\n")
    WandBLogger(project="p")
    # So is an explicit mode.
    monkeypatch.setenv("NETRC", str(tmp_path / "missing"))
    WandBLogger(project="p", mode="disabled")


def test_wandb_argument_errors():
    pytest.importorskip("wandb")
    with pytest.raises(LoggerArgumentError, match=r"project=\.\.\."):
        WandBLogger(project="")
    with pytest.raises(LoggerArgumentError, match=r"config=\.\.\."):
        WandBLogger(project="p", config=[1, 2])  # type: ignore[arg-type]
