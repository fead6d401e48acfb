"""How fast a data loader feeds training, and a tuned copy of it.

:class:`DataLoaderProfiler` pulls up to ``max_batches`` batches with nothing else running and
times them: the first batch (worker start-up included) separately from the steady state, so
``batches_per_sec`` is what training can be fed once running. :func:`optimize_dataloader`
measures a few worker counts that way and returns a new loader with the fastest, over the same
dataset, sampler, batch size, ``drop_last`` and collate function, so it yields the same batches.

Both leave the global torch RNG (and the loader's and sampler's generators) as they found them:
measuring does not change the shuffle order of the training that follows.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, IterableDataset
from torch.utils.data import DataLoader as TorchDataLoader

from ace3.training.data.loader import DataLoader, usable_cpu_count


@contextlib.contextmanager
def preserved_rng(loader: TorchDataLoader[Any]) -> Iterator[None]:
    """Restore the global torch RNG and the loader's/sampler's generators on exit."""
    generators: list[tuple[Any, Any]] = []
    for owner in (loader, loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(
            g is not generator for g, _ in generators
        ):
            generators.append((generator, generator.get_state()))
    state = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(state)
        for generator, saved in generators:
            generator.set_state(saved)


def _batch_len(batch: Any) -> int:
    """Samples in a collated batch: the leading size of its first tensor (1 if none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, Mapping):
        for value in batch.values():
            return _batch_len(value)
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if isinstance(first, (torch.Tensor, Mapping, list, tuple)):
            return _batch_len(first)
        return len(batch)
    return 1


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = max(0, math.ceil(q / 100.0 * len(ordered)) - 1)
    return ordered[rank]


@dataclass(frozen=True)
class DataLoaderReport:
    """Timings of one pass over up to ``max_batches`` batches (seconds, per second).

    ``time_to_first_batch_s`` includes starting workers; ``mean_wait_s`` / ``p95_wait_s`` are
    the waits for each later batch; ``batches_per_sec`` and ``samples_per_sec`` are the steady
    state (after the first batch; from the first batch alone when there is only one).
    """

    batches: int
    samples: int
    time_to_first_batch_s: float
    total_time_s: float
    batches_per_sec: float
    samples_per_sec: float
    mean_wait_s: float
    p95_wait_s: float
    num_workers: int
    batch_size: int | None
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool

    def summary(self) -> str:
        lines = [
            f"DataLoader profile: {self.batches} batches, {self.samples} samples "
            f"(batch_size={self.batch_size}, num_workers={self.num_workers}, "
            f"pin_memory={self.pin_memory}, prefetch_factor={self.prefetch_factor}, "
            f"persistent_workers={self.persistent_workers})",
            f"  time to first batch: {self.time_to_first_batch_s * 1000:.1f} ms",
            f"  throughput:          {self.batches_per_sec:.1f} batches/s, "
            f"{self.samples_per_sec:.1f} samples/s",
            f"  wait per batch:      mean {self.mean_wait_s * 1000:.2f} ms, "
            f"p95 {self.p95_wait_s * 1000:.2f} ms",
        ]
        cpus = usable_cpu_count()
        if self.num_workers == 0 and cpus > 1:
            lines.append(
                "  hint: batches load in the training process; worker processes "
                "(num_workers) or ace3.optimize_dataloader(loader) may feed training faster"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def _check_loader(dataloader: Any) -> TorchDataLoader[Any]:
    if not isinstance(dataloader, TorchDataLoader):
        raise TypeError(
            "dataloader must be an ace3.DataLoader or torch.utils.data.DataLoader, got "
            f"{type(dataloader).__name__}"
        )
    return dataloader


def _check_max_batches(max_batches: Any) -> int:
    if isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1:
        raise ValueError(f"max_batches must be an int >= 1, got {max_batches!r}")
    return max_batches


class DataLoaderProfiler:
    """Times how fast a loader yields batches (see the module docstring)."""

    def profile(
        self, dataloader: TorchDataLoader[Any], max_batches: int = 50, verbose: bool = True
    ) -> DataLoaderReport:
        """Pull up to ``max_batches`` batches and return (and, if ``verbose``, print) the
        :class:`DataLoaderReport`."""
        loader = _check_loader(dataloader)
        limit = _check_max_batches(max_batches)
        waits: list[float] = []
        samples = first_samples = 0
        with preserved_rng(loader):
            start = time.perf_counter()
            iterator = iter(loader)
            try:
                while len(waits) < limit:
                    before = time.perf_counter()
                    try:
                        batch = next(iterator)
                    except StopIteration:
                        break
                    waits.append(time.perf_counter() - (start if not waits else before))
                    samples += _batch_len(batch)
                    if len(waits) == 1:
                        first_samples = samples
            finally:
                del iterator  # shuts non-persistent workers down now
            total = time.perf_counter() - start
        if not waits:
            raise ValueError("dataloader yielded no batches: its dataset or sampler is empty")
        steady = waits[1:] or waits
        steady_time = sum(steady) or 1e-9
        steady_samples = samples if len(waits) == 1 else samples - first_samples
        report = DataLoaderReport(
            batches=len(waits),
            samples=samples,
            time_to_first_batch_s=waits[0],
            total_time_s=total,
            batches_per_sec=len(steady) / steady_time,
            samples_per_sec=steady_samples / steady_time,
            mean_wait_s=sum(steady) / len(steady),
            p95_wait_s=_percentile(steady, 95.0),
            num_workers=loader.num_workers,
            batch_size=loader.batch_size,
            pin_memory=loader.pin_memory,
            prefetch_factor=loader.prefetch_factor,
            persistent_workers=loader.persistent_workers,
        )
        if verbose:
            print(report.summary(), flush=True)
        return report


def _candidates(candidates: Any, cpus: int) -> list[int]:
    if candidates is None:
        counts = {0, cpus}
        count = 1
        while count < cpus:
            counts.add(count)
            count *= 2
        return sorted(counts)
    if not isinstance(candidates, (list, tuple, set, range)) or not candidates:
        raise ValueError(
            f"candidates must be a non-empty list of worker counts, got {candidates!r}"
        )
    for value in candidates:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"candidates: worker counts must be ints >= 0, got {value!r}")
    usable = sorted({min(value, cpus) for value in candidates})
    if max(candidates) > cpus:
        warnings.warn(
            f"optimize_dataloader: candidates above the {cpus} usable CPU(s) are tried as {cpus}",
            UserWarning,
            stacklevel=3,
        )
    return usable


def _same_batches_kwargs(loader: TorchDataLoader[Any]) -> dict[str, Any]:
    """The arguments that decide which batches a loader yields, and how they are made."""
    kwargs: dict[str, Any] = {
        "collate_fn": loader.collate_fn,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
        "timeout": loader.timeout,
        "multiprocessing_context": loader.multiprocessing_context,
    }
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    if isinstance(loader.dataset, IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_size is not None and type(loader.batch_sampler) is BatchSampler:
        kwargs.update(
            batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last
        )
    elif loader.batch_sampler is not None:
        kwargs["batch_sampler"] = loader.batch_sampler
    else:  # batch_size=None: one sample at a time
        kwargs.update(batch_size=None, sampler=loader.sampler)
    return kwargs


def _build(
    loader: TorchDataLoader[Any], workers: int, prefetch: int, persistent: bool
) -> DataLoader:
    return DataLoader(
        loader.dataset,
        num_workers=workers,
        pin_memory=torch.cuda.is_available(),
        prefetch_factor=prefetch if workers > 0 else None,
        persistent_workers=persistent and workers > 0,
        **_same_batches_kwargs(loader),
    )


def optimize_dataloader(
    dataloader: TorchDataLoader[Any],
    candidates: list[int] | None = None,
    max_batches: int = 20,
    verbose: bool = True,
) -> DataLoader:
    """A new :class:`DataLoader` over the same batches with a measured ``num_workers``.

    Tries each worker count in ``candidates`` (default: 0, 1, 2, 4, ... up to the usable CPUs)
    for ``max_batches`` batches and keeps the fastest steady-state throughput (the fewest
    workers among those within 5% of it). The result pins memory when CUDA is available, keeps
    workers alive between epochs, and prefetches at least 2 batches per worker. An
    ``IterableDataset`` keeps its worker count (each worker would replay the whole stream
    unless the dataset shards itself), only the other options change. The chosen loader's
    measurements are in ``loader.tuning_reports`` (worker count -> report).
    """
    loader = _check_loader(dataloader)
    limit = _check_max_batches(max_batches)
    cpus = usable_cpu_count()
    counts = _candidates(candidates, cpus)
    asked_prefetch = loader.prefetch_factor if loader.num_workers > 0 else None
    prefetch = max(2, asked_prefetch or 2)
    if isinstance(loader.dataset, IterableDataset):
        counts = [loader.num_workers]
    profiler = DataLoaderProfiler()
    reports: dict[int, DataLoaderReport] = {}
    for workers in counts:
        # One pass each: no persistent workers, so they stop as soon as the pass ends.
        trial = _build(loader, workers, prefetch, persistent=False)
        reports[workers] = profiler.profile(trial, max_batches=limit, verbose=False)
    fastest = max(report.samples_per_sec for report in reports.values())
    chosen = min(w for w, r in reports.items() if r.samples_per_sec >= 0.95 * fastest)
    result = _build(loader, chosen, prefetch, persistent=True)
    result.tuning_reports = reports
    if verbose:
        tried = ", ".join(f"{w}: {r.samples_per_sec:.0f}" for w, r in sorted(reports.items()))
        print(
            f"optimize_dataloader: num_workers={chosen} (samples/s by num_workers: {tried}); "
            f"pin_memory={result.pin_memory}, persistent_workers={result.persistent_workers}, "
            f"prefetch_factor={result.prefetch_factor}",
            flush=True,
        )
    return result
