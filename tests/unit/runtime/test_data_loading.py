"""ace3.DataLoader options, DataLoaderProfiler numbers, optimize_dataloader's batches."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, IterableDataset, SequentialSampler, TensorDataset

import ace3.training.data.loader as dataloader_module
from ace3.training.data import (
    DataLoader,
    DataLoaderOptions,
    DataLoaderProfiler,
    DataLoaderReport,
    optimize_dataloader,
)


def _dataset(n: int = 100) -> TensorDataset:
    return TensorDataset(torch.arange(n, dtype=torch.float32).unsqueeze(1), torch.arange(n))


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(10))


def _targets(loader) -> list[list[int]]:
    return [batch[1].tolist() for batch in loader]


def test_document_options_work_on_any_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dataloader_module, "usable_cpu_count", lambda: 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DataLoader(
            _dataset(),
            batch_size=32,
            num_workers=8,
            pin_memory=True,
            prefetch_factor=2,
            persistent_workers=True,
        )
    assert [str(w.message) for w in caught] == [
        "ace3.DataLoader: num_workers=8 is more than the 2 CPU(s) this process can use; "
        "using num_workers=2"
    ]
    assert loader.num_workers == 2 and loader.prefetch_factor == 2 and loader.persistent_workers
    assert loader.pin_memory == torch.cuda.is_available()
    assert loader.options == DataLoaderOptions(
        batch_size=32,
        shuffle=False,
        num_workers=8,
        pin_memory=True,
        prefetch_factor=2,
        persistent_workers=True,
        drop_last=False,
    )
    assert [len(t) for t in _targets(loader)] == [32, 32, 32, 4]


def test_worker_options_are_ignored_without_workers() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no warning for pin_memory on a CPU machine
        loader = DataLoader(
            _dataset(10), batch_size=4, prefetch_factor=4, persistent_workers=True,
            pin_memory=not torch.cuda.is_available(), drop_last=True,
        )  # fmt: skip
    assert loader.prefetch_factor is None and not loader.persistent_workers
    assert _targets(loader) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert loader.options.prefetch_factor == 4  # what was asked is kept


def test_bad_options_name_the_argument() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(_dataset(), num_workers=-1)
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(_dataset(), batch_size=0)
    with pytest.raises(ValueError, match="prefetch_factor"):
        DataLoader(_dataset(), num_workers=1, prefetch_factor=0)
    with pytest.raises(TypeError, match="shuffle"):
        DataLoader(_dataset(), shuffle="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dataset must be"):
        DataLoader(42)
    with pytest.raises(FileNotFoundError, match="dataset"):
        DataLoader("/no/such/data.npz")


def test_a_local_dataset_path_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "data.npz"
    np.savez(path, x=np.zeros((6, 3), dtype=np.float32), y=np.arange(6))
    loader = DataLoader(str(path), batch_size=4)
    assert _targets(loader) == [[0, 1, 2, 3], [4, 5]]


def test_profiler_reports_sane_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    loader = DataLoader(_dataset(), batch_size=10)
    report = DataLoaderProfiler().profile(loader, max_batches=5)
    assert isinstance(report, DataLoaderReport)
    assert report.batches == 5 and report.samples == 50
    assert report.time_to_first_batch_s > 0 and report.total_time_s >= report.time_to_first_batch_s
    assert report.batches_per_sec > 0
    assert report.samples_per_sec == pytest.approx(report.batches_per_sec * 10, rel=1e-6)
    assert 0 < report.mean_wait_s <= report.p95_wait_s * 4 + 1e-9
    assert report.num_workers == 0
    assert "time to first batch" in capsys.readouterr().out
    full = DataLoaderProfiler().profile(loader, verbose=False)  # fewer batches than asked
    assert full.batches == 10 and full.samples == 100
    with pytest.raises(ValueError, match="max_batches"):
        DataLoaderProfiler().profile(loader, max_batches=0)
    with pytest.raises(TypeError, match="dataloader"):
        DataLoaderProfiler().profile([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no batches"):
        DataLoaderProfiler().profile(DataLoader(_dataset(3), batch_size=4, drop_last=True))


def test_profiling_with_workers_and_rng_left_alone() -> None:
    loader = DataLoader(_dataset(40), batch_size=8, num_workers=1, shuffle=True)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    report = DataLoaderProfiler().profile(loader, verbose=False)
    assert report.num_workers == 1 and report.samples == 40
    assert torch.equal(torch.get_rng_state(), before)


def test_optimized_loader_yields_identical_batches(capsys: pytest.CaptureFixture[str]) -> None:
    original = DataLoader(_dataset(50), batch_size=8, shuffle=True, drop_last=True)
    optimized = optimize_dataloader(original, candidates=[0, 1], max_batches=3)
    assert "optimize_dataloader: num_workers=" in capsys.readouterr().out
    assert optimized.num_workers in (0, 1)
    assert set(optimized.tuning_reports) == {0, 1}
    assert optimized.sampler is original.sampler and optimized.drop_last
    assert optimized.pin_memory == torch.cuda.is_available()
    assert optimized.persistent_workers == (optimized.num_workers > 0)
    for seed in (0, 1):
        torch.manual_seed(seed)
        expected = _targets(original)
        torch.manual_seed(seed)
        assert _targets(optimized) == expected
    # forcing workers: still the same batches
    forced = optimize_dataloader(original, candidates=[1], max_batches=2, verbose=False)
    assert forced.num_workers == 1 and forced.prefetch_factor == 2 and forced.persistent_workers
    torch.manual_seed(5)
    expected = _targets(original)
    torch.manual_seed(5)
    assert _targets(forced) == expected


def test_optimize_keeps_custom_batch_samplers_and_iterable_datasets() -> None:
    batches = BatchSampler(SequentialSampler(range(12)), batch_size=5, drop_last=False)
    original = torch.utils.data.DataLoader(_dataset(12), batch_sampler=batches)
    optimized = optimize_dataloader(original, candidates=[0], max_batches=2, verbose=False)
    assert optimized.batch_sampler is batches
    assert _targets(optimized) == _targets(original)

    stream = torch.utils.data.DataLoader(_Stream(), batch_size=4)
    tuned = optimize_dataloader(stream, verbose=False)
    assert tuned.num_workers == 0  # an IterableDataset keeps its worker count
    assert [b.tolist() for b in tuned] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_optimize_rejects_bad_arguments() -> None:
    loader = DataLoader(_dataset(10), batch_size=5)
    with pytest.raises(ValueError, match="candidates"):
        optimize_dataloader(loader, candidates=[])
    with pytest.raises(ValueError, match="candidates"):
        optimize_dataloader(loader, candidates=[-1])
    with pytest.raises(ValueError, match="max_batches"):
        optimize_dataloader(loader, max_batches=0)
    with pytest.raises(TypeError, match="dataloader"):
        optimize_dataloader("loader")  # type: ignore[arg-type]
