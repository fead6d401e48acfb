"""The engine's rank-aware log (``ace3.runtime.observe.log``): lines reach stdout/stderr as the
prints did (so the ``[rank R] `` prefix and the worker's parsing are unchanged), every record
carries the rank, the metric echo has its own logger, and the user's own prints pass through
untouched."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import ace3
from ace3.runtime.observe.log import (
    ENGINE,
    METRICS,
    TO_STDERR,
    current_rank,
    keep_engine_log,
    set_rank,
)


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[Keep]:
    handler = Keep()
    ENGINE.addHandler(handler)  # (the metrics logger's records reach it too: its child)
    try:
        yield handler
    finally:
        ENGINE.removeHandler(handler)


def test_a_line_is_written_as_print_wrote_it(capsys: pytest.CaptureFixture[str]) -> None:
    ENGINE.info("checkpoint step-00000004.pt saved (100% done)")
    METRICS.info("step 4 epoch 1 train_loss=0.50000 lr=0.01")
    ENGINE.error("StepOutOfMemoryError: step 3", extra=TO_STDERR)
    captured = capsys.readouterr()
    assert captured.out == (
        "checkpoint step-00000004.pt saved (100% done)\nstep 4 epoch 1 train_loss=0.50000 lr=0.01\n"
    )
    assert captured.err == "StepOutOfMemoryError: step 3\n"


def test_a_user_logging_setup_does_not_take_the_engine_out_of_the_job_log(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import logging.config

    existing = {
        logger: logger.disabled
        for logger in logging.root.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    }
    root_level, root_handlers = logging.root.level, list(logging.root.handlers)
    # what a model file may do at import: dictConfig disables every existing logger by default
    logging.config.dictConfig({"version": 1, "root": {"level": "WARNING"}})
    try:
        assert ENGINE.disabled and METRICS.disabled
        keep_engine_log()  # (the entry point, once the user's code is imported)
        ENGINE.info("checkpoint step-00000002.pt saved")
        METRICS.info("done: 2 steps")
        ENGINE.error("TrainingPreemptedError: drained", extra=TO_STDERR)
        captured = capsys.readouterr()
        assert captured.out == "checkpoint step-00000002.pt saved\ndone: 2 steps\n"
        assert captured.err == "TrainingPreemptedError: drained\n"
    finally:
        keep_engine_log()
        for logger, disabled in existing.items():  # (the rest of the test run's loggers)
            logger.disabled = disabled
        logging.root.setLevel(root_level)
        logging.root.handlers[:] = root_handlers


def test_every_record_carries_the_rank(kept: Keep, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setattr("ace3.runtime.observe.log._rank", None)
    assert current_rank() == 5
    ENGINE.info("from the environment")
    set_rank(2)
    METRICS.info("set by the entry point")
    assert [(r.name, r.rank) for r in kept.records] == [  # type: ignore[attr-defined]
        ("ace3.runtime", 5),
        ("ace3.runtime.metrics", 2),
    ]


def test_the_prefix_is_added_under_torchrun_as_before() -> None:
    code = (
        "from ace3.runtime.process.log_prefix import install_log_prefix\n"
        "from ace3.runtime.observe.log import ENGINE, METRICS, TO_STDERR\n"
        "install_log_prefix(1)\n"
        "ENGINE.info('ready: world_size=2')\n"
        "print('a user print')\n"
        "METRICS.info('step 1 epoch 1 train_loss=1.00000 lr=0.1')\n"
        "ENGINE.error('TrainingPreemptedError: x', extra=TO_STDERR)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "[rank 1] ready: world_size=2\n[rank 1] a user print\n"
        "[rank 1] step 1 epoch 1 train_loss=1.00000 lr=0.1\n"
    )
    assert done.stderr == "[rank 1] TrainingPreemptedError: x\n"


class Printing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print(f"user: forward {x.shape[0]} (100%)")  # the user's own print, left alone
        return self.layer(x)


def test_a_run_echoes_its_metrics_on_their_own_logger(
    kept: Keep, capsys: pytest.CaptureFixture[str]
) -> None:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(16, 4, generator=generator)
    data = TensorDataset(inputs, (inputs.sum(1) > 0).long())
    config = ace3.TrainingConfig(epochs=1, batch_size=8, validation_split=0, log_interval=1)
    ace3.Trainer(config).train(Printing(), data)
    out = capsys.readouterr().out
    echoed = [r.getMessage() for r in kept.records if r.name == "ace3.runtime.metrics"]
    assert [line.split(" train_loss")[0] for line in echoed[:2]] == [
        "step 1 epoch 1",
        "step 2 epoch 1",
    ]
    assert echoed[-1].startswith("done: ")
    assert all(line + "\n" in out for line in echoed)  # the same text on stdout
    assert "user: forward 8 (100%)\n" in out
    notes = [r.getMessage() for r in kept.records if r.name == "ace3.runtime"]
    assert notes and notes[0].startswith("local run: 16 training samples")
