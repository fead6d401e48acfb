"""A user's ``IterableDataset`` in the engine, piece by piece: what ``build_dataset`` is given,
what ``load_datasets`` refuses, the training source's cycle (``set_epoch``, exactly the loop's
batches), its position with and without ``state_dict``, the validation loader's batches, and the
pipeline's lockstep validation over a replica without batches (two gloo processes). Whole runs
under torchrun are in tests/integration/runtime/test_runtime_iterable.py."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import IterableDataset

from ace3.config import TrainingConfig
from ace3.runtime.data.datasets import call_build_dataset, load_datasets
from ace3.runtime.data.iterable_source import IterableTrainData
from ace3.runtime.data.loaders import validation_loader
from ace3.runtime.data.train_source import train_data_for
from ace3.runtime.job_spec import DatasetSpec
from ace3.runtime.loop.precision import resolve_precision
from ace3.runtime.parallel.dims import ParallelDims
from ace3.runtime.parallel.pipeline import PipelineParallel
from ace3.runtime.process.distributed import DistContext
from tests.iterable_digits import write_iterable_dataset


def _config(**fields: Any) -> TrainingConfig:
    return TrainingConfig(**{"batch_size": 4, "seed": 3, **fields})


def _digits(directory: Path, stateful: bool, validation: int = 0) -> DatasetSpec:
    inputs = np.random.default_rng(0).random((30, 4), dtype=np.float32)
    write_iterable_dataset(
        directory, inputs, np.arange(30) % 3, stateful=stateful, validation=validation
    )
    return DatasetSpec(path=str(directory))


def test_build_dataset_gets_rank_and_world_size_when_it_names_them() -> None:
    def plain(split: str) -> Any:
        return (split,)

    def named(split: str, rank: int, world_size: int = 1) -> Any:
        return split, rank, world_size

    def open_ended(split: str, **kwargs: Any) -> Any:
        return split, kwargs

    def one(split: str, *, world_size: int) -> Any:
        return split, world_size

    assert call_build_dataset(plain, "train", (1, 4)) == ("train",)
    assert call_build_dataset(named, "validation", (1, 4)) == ("validation", 1, 4)
    assert call_build_dataset(open_ended, "train", (2, 3)) == (
        "train", {"rank": 2, "world_size": 3},
    )  # fmt: skip
    assert call_build_dataset(one, "train", (0, 2)) == ("train", 2)


def test_an_iterable_training_set_refuses_epochs_and_needs_max_steps(tmp_path: Path) -> None:
    spec = _digits(tmp_path / "ds", stateful=False)
    with pytest.raises(ValueError, match=r"^epochs=2: the training set is an IterableDataset"):
        load_datasets(spec, None, _config(epochs=2, max_steps=5))
    with pytest.raises(ValueError, match=r"^max_steps: the training set is an IterableDataset"):
        load_datasets(spec, None, _config())
    train = load_datasets(spec, None, _config(max_steps=5), (1, 2)).train
    assert isinstance(train, IterableDataset)
    assert (train.rank, train.world_size) == (1, 2)
    with pytest.raises(ValueError, match=r"^max_steps: "):  # (an in-process run's too)
        IterableTrainData(train, _config(), (0, 1), 4, 0, False)


def test_no_fraction_of_an_iterable_is_held_out(tmp_path: Path) -> None:
    spec = _digits(tmp_path / "ds", stateful=False)
    with pytest.raises(ValueError, match=r"^validation_split=0.2: the training set is an Iter"):
        load_datasets(spec, None, _config(max_steps=5, validation_split=0.2))
    data = load_datasets(spec, None, _config(max_steps=5))
    assert data.validation is None and data.notes[0].startswith("validation: none (no fraction")
    assert load_datasets(spec, None, _config(max_steps=5, validation_split=0)).notes == ()
    split = _digits(tmp_path / "split", stateful=False, validation=6)
    data = load_datasets(split, None, _config(max_steps=5), (0, 2))
    assert isinstance(data.validation, IterableDataset) and data.notes == ()
    # One pass of rank 0's copy, batched as a map-style dataset's (default_collate: a list).
    batches = list(validation_loader(data.validation, 0, 2, 2, 0, False))
    assert [b[1].tolist() for b in batches] == [[0, 2], [1]]  # samples 24, 26, 28 of the file
    assert all(isinstance(b, list) for b in batches)


class _Counting(IterableDataset[Any]):
    """``size`` samples (their index, their dataset epoch), the ``set_epoch`` calls recorded."""

    def __init__(self, size: int) -> None:
        self.size, self.epoch = size, 0
        self.calls: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.calls.append(epoch)

    def __iter__(self) -> Any:
        for index in range(self.size):
            yield torch.tensor(float(index)), torch.tensor(self.epoch)


def test_an_iterable_cycles_with_set_epoch_for_exactly_the_loops_batches() -> None:
    config = _config(max_steps=4, gradient_accumulation_steps=2)
    data = _Counting(5)
    source = train_data_for(data, config, (0, 1), 2, rank=0, pin_memory=False)
    assert isinstance(source, IterableTrainData)
    assert (source.batches_per_epoch, source.epochs, source.cycling) == (8, 1, True)
    assert "it resumes mid-epoch" not in source.describe()
    batches = source.batches(0, 0, None, None)
    taken = [next(batches) for _ in range(8)]  # 3 batches a dataset epoch: 5 = 2 + 2 + 1
    assert [b[1].tolist() for b in taken] == [[0, 0], [0, 0], [0], [1, 1], [1, 1], [1], [2, 2], [2, 2]]  # fmt: skip
    assert data.calls == [0, 1, 2]
    position = source.position()
    assert (position["dataset_epoch"], position["batches_in_dataset_epoch"]) == (2, 2)
    assert position["batch_in_epoch"] == 8 and position["loader"] is None
    assert list(source.batches(0, 8, position, None)) == []  # (the run's end)


def test_a_replica_without_samples_is_an_error() -> None:
    source = train_data_for(_Counting(0), _config(max_steps=2), (1, 2), 2, 1, False)
    with pytest.raises(RuntimeError, match=r"gave no sample in its epoch 0 on rank 1 \(data rep"):
        next(source.batches(0, 0, None, None))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_with_state_a_resume_reads_exactly_the_samples_left(
    tmp_path: Path, num_workers: int
) -> None:
    spec = _digits(tmp_path / "ds", stateful=True)
    config = _config(max_steps=10, num_workers=num_workers)

    def source() -> Any:
        train = load_datasets(spec, None, config, (1, 2)).train
        return train_data_for(train, config, (1, 2), 4, 1, False)

    first = source()
    assert "it resumes mid-epoch (state_dict)" in first.describe()
    batches = first.batches(0, 0, None, None)
    for _ in range(5):  # (past the end of a dataset epoch: 15 samples a rank, 4 batches)
        next(batches)
    position = first.position()
    assert position["dataset_epoch"] == 1 and position["loader"] is not None
    rest = [next(batches)[1].tolist() for _ in range(5)]
    assert [b[1].tolist() for b in source().batches(0, 5, position, None)] == rest
    with pytest.raises(ValueError, match="saved with per_rank_batch=4 and this run has per_rank"):
        train = load_datasets(spec, None, config, (1, 2)).train
        train_data_for(train, config, (1, 2), 2, 1, False).batches(0, 5, position, None)
    with pytest.raises(ValueError, match="needs its data position, and the checkpoint holds"):
        source().batches(0, 5, None, None)


def test_without_state_a_resume_restarts_its_epoch_and_says_so(tmp_path: Path) -> None:
    spec = _digits(tmp_path / "ds", stateful=False)
    config = _config(max_steps=10)
    train = load_datasets(spec, None, config).train
    source = train_data_for(train, config, (0, 1), 4, 0, False)
    batches = source.batches(0, 0, None, None)
    for _ in range(9):  # 30 samples: 8 batches a dataset epoch
        next(batches)
    position = source.position()
    assert (position["dataset_epoch"], position["batches_in_dataset_epoch"]) == (1, 1)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("ace3.runtime")
    logger.addHandler(handler)
    try:
        again = train_data_for(load_datasets(spec, None, config).train, config, (0, 1), 4, 0, False)
        resumed = again.batches(0, 9, position, None)
        # Its epoch 1 from its start (set_epoch(1): the same order as the first run's).
        assert torch.equal(next(resumed)[1], _epoch_start(spec, config, 1))
    finally:
        logger.removeHandler(handler)
    assert records == [
        "resuming: the IterableDataset Digits has no state_dict() / load_state_dict(), so its "
        "epoch 1 restarts from its beginning: the samples of the interrupted epoch may repeat"
    ]


def _epoch_start(spec: DatasetSpec, config: TrainingConfig, epoch: int) -> torch.Tensor:
    source = train_data_for(load_datasets(spec, None, config).train, config, (0, 1), 4, 0, False)
    batches = source.batches(0, 0, None, None)
    for _ in range(8 * epoch):
        next(batches)
    return next(batches)[1]


class _OnRankZero(IterableDataset[Any]):
    """Rank 0 holds 5 samples, rank 1 none."""

    def __iter__(self) -> Any:
        for index in range(5 if dist.get_rank() == 0 else 0):
            yield torch.tensor([float(index)]), torch.tensor(index % 2)


class _Runner:
    """The pipeline runner's part in validation: the batches it was given, and its sums."""

    def __init__(self) -> None:
        self.passes: list[tuple[list[int], bool]] = []
        self.sums = [0.0, 0.0, 0.0, 0.0]

    def reset_sums(self) -> None:
        self.sums = [0.0, 0.0, 0.0, 0.0]

    def eval_batch(self, batch: Any, counted: bool = True) -> None:
        self.passes.append((batch[1].tolist(), counted))
        if counted:
            self.sums[0] += float(len(batch[1]))  # (a "loss" of 1 a sample)
            self.sums[1] += len(batch[1])


def _pipeline_rank(rank: int, init_file: str, out: dict[int, Any]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        own = [dist.new_group([0]), dist.new_group([1])][rank]  # (each pipeline: one stage)
        pipeline = PipelineParallel.__new__(PipelineParallel)
        pipeline.ctx = DistContext(rank, rank, 2, "gloo", torch.device("cpu"))
        pipeline.dims = ParallelDims(dp=2, pp=1, tp=1, rank=rank)
        pipeline.plan = object()  # type: ignore[assignment]  # (sharded replicas: their forward passes in lockstep)
        runner = _Runner()
        pipeline.runner = runner  # type: ignore[assignment]
        pipeline._group = lambda: own  # type: ignore[method-assign]
        pipeline.after_evaluation = lambda parts: None  # type: ignore[method-assign]
        model = torch.nn.Linear(1, 1)
        parts = SimpleNamespace(
            model=model, precision=resolve_precision(TrainingConfig(), torch.device("cpu"))
        )
        loader = validation_loader(_OnRankZero(), rank, 2, 2, 0, False)
        values = pipeline.evaluate(parts, loader)
        out[rank] = (values, runner.passes)
    finally:
        dist.destroy_process_group()


def test_the_pipeline_validates_an_iterable_in_lockstep_padding_a_replica_without_data(
    tmp_path: Path,
) -> None:
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_pipeline_rank, args=(str(tmp_path / "init"), out), nprocs=2, join=True)
        results = dict(out)
    (values0, passes0), (values1, passes1) = results[0], results[1]
    assert passes0 == [([0, 1], True), ([0, 1], True), ([0], True)]
    assert passes1 == [([0, 1], False)] * 3  # rank 0's first batch, uncounted, as often
    assert values0 == values1 == {"val_loss": 1.0, "val_accuracy": 0.0}
