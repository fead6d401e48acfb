"""Resolve the job's training and validation datasets.

A dataset path is a data file (see :mod:`ace3.runtime.data.dataset_files`) or a directory holding
either a ``dataset.py`` that defines ``build_dataset(split)`` (split is ``'train'`` or
``'validation'``; it returns a map-style ``torch.utils.data.Dataset``, an
``IterableDataset``, a tuple ``(inputs, targets)``, or ``None`` for no such split) or exactly
one data file. ``build_dataset`` also gets ``rank`` and ``world_size`` as keyword arguments when
its signature names them (or takes ``**kwargs``): this rank's data-parallel replica and how many
there are (the ranks of one replica, pipeline stages or tensor shards, read the same data), for
an ``IterableDataset`` to split its samples by (:func:`call_build_dataset`).

An ``IterableDataset`` for training has no length: it cycles for ``max_steps`` steps and refuses
``epochs`` (:func:`refuse_iterable_epochs`; the loop's side is
:mod:`ace3.runtime.data.iterable_source`); no fraction of it can be held out, so its validation
comes from ``validation_dataset`` or ``build_dataset('validation')`` (an explicit
``validation_split`` is refused; the default means none, said in the log).

Validation data comes from ``validation_dataset``; else from holding out an explicit
``validation_split`` of the training data (a permutation seeded by ``config.seed``: the same on
every rank and every run); else from ``build_dataset('validation')`` of a ``dataset.py``; else,
when ``validation_split`` is left at its default (None), from holding out 10%. An explicit
``validation_split=0`` means no validation.

A dataset with ``stream`` set (a sharded dataset the worker streams into the job) gives
:class:`ace3.runtime.data.stream.ShardStream` readers of this rank's data replica instead: the
training split from the train shards of :func:`ace3.runtime.data.stream.split_shards`, the
validation split from a streamed validation dataset (or a file one, loaded as above), or else
from the shards it holds out (whole shards: 10% by default, none of a single shard, none with
``validation_split=0``). A stream cycles when ``epochs`` is unset and ``max_steps`` set, or
when its sample count is unknown (jsonl, webdataset), where ``max_steps`` is required and
``epochs`` refused (:func:`refuse_uncounted_epochs`).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import zlib
from collections.abc import Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, Subset

from ace3.config import TrainingConfig
from ace3.runtime.data.dataset_files import DATA_SUFFIXES, load_data_file, make_dataset
from ace3.runtime.job_spec import DatasetSpec, StreamSpec

Split = str  # 'train' or 'validation'


@dataclass(frozen=True)
class Datasets:
    train: Dataset[Any]
    validation: Dataset[Any] | None
    notes: tuple[str, ...] = ()  # for the run's log (how a streamed dataset was split)


def _check_dataset(dataset: Any, origin: str) -> Dataset[Any]:
    """A map-style dataset (not empty) or an ``IterableDataset`` (whose emptiness shows when it
    is read)."""
    if isinstance(dataset, IterableDataset):
        return dataset
    if not (hasattr(dataset, "__getitem__") and isinstance(dataset, Sized)):
        raise TypeError(
            f"{origin} must give a map-style dataset (with __len__ and __getitem__) or a "
            f"torch.utils.data.IterableDataset, got {type(dataset).__name__}"
        )
    if len(dataset) == 0:
        raise ValueError(f"{origin} gave an empty dataset")
    return dataset


def _import_dataset_module(path: Path) -> Any:
    name = f"ace3_user_dataset_{zlib.crc32(str(path).encode()):08x}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def call_build_dataset(build: Any, split: Split, replica: tuple[int, int]) -> Any:
    """``build(split)``, with ``rank=`` and ``world_size=`` (``replica``) when its signature
    names them or takes ``**kwargs``."""
    try:
        parameters = dict(inspect.signature(build).parameters)
    except (TypeError, ValueError):  # (a builtin or C callable: no signature to read)
        parameters = {}
    keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    named = {"rank": replica[0], "world_size": replica[1]}
    extra = {
        name: value
        for name, value in named.items()
        if keywords
        or (name in parameters and parameters[name].kind is not inspect.Parameter.POSITIONAL_ONLY)
    }
    return build(split, **extra)


def _from_dataset_py(path: Path, split: Split, replica: tuple[int, int]) -> Dataset[Any] | None:
    module = _import_dataset_module(path)
    build = getattr(module, "build_dataset", None)
    if not callable(build):
        raise ValueError(f"{path} must define a function build_dataset(split)")
    result = call_build_dataset(build, split, replica)
    if result is None:
        return None
    if isinstance(result, tuple) and len(result) == 2:
        return make_dataset(result[0], result[1], path)
    return _check_dataset(result, f"{path}: build_dataset({split!r})")


def single_data_file(directory: Path) -> Path:
    files = sorted(
        p
        for p in directory.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in DATA_SUFFIXES
    )
    if len(files) != 1:
        found = ", ".join(p.name for p in files) or "none"
        raise ValueError(
            f"dataset directory {directory} must hold a dataset.py with build_dataset(split) or "
            f"exactly one data file ({', '.join(DATA_SUFFIXES)}); data files found: {found}"
        )
    return files[0]


def load_dataset(
    spec: DatasetSpec, split: Split, replica: tuple[int, int] = (0, 1)
) -> Dataset[Any] | None:
    """Load one dataset; ``None`` only when a dataset.py has no such split (``replica``: what a
    dataset.py's ``build_dataset`` may get as ``rank`` and ``world_size``)."""
    path = Path(spec.path).resolve()
    if not path.exists():
        raise FileNotFoundError(f"dataset not found: {path}")
    if path.is_dir():
        script = path / "dataset.py"
        if script.is_file():
            return _from_dataset_py(script, split, replica)
        path = single_data_file(path)
    return load_data_file(path)


def split_holdout(
    dataset: Dataset[Any], fraction: float, seed: int
) -> tuple[Dataset[Any], Dataset[Any]]:
    """Deterministically hold out ``fraction`` of ``dataset`` (at least one sample each side)."""
    n = len(dataset)
    if n < 2:
        raise ValueError(f"validation_split needs at least 2 samples, the dataset has {n}")
    n_val = min(max(1, round(n * fraction)), n - 1)
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=generator).tolist()
    return Subset(dataset, order[n_val:]), Subset(dataset, order[:n_val])


DEFAULT_VALIDATION_SPLIT = 0.1


def refuse_uncounted_epochs(config: TrainingConfig) -> None:
    """A stream whose epochs cannot be counted (its sample count is unknown) cycles for
    ``max_steps`` steps: it needs them, and refuses ``epochs``."""
    if config.epochs is not None:
        raise ValueError(
            f"epochs={config.epochs}: the sample count of this streamed dataset is not known "
            "(jsonl and webdataset shards record none), so its epochs cannot be counted: leave "
            "epochs unset and set max_steps, the stream cycles"
        )
    if config.max_steps is None:
        raise ValueError(
            "max_steps: the sample count of this streamed dataset is not known (jsonl and "
            "webdataset shards record none), so an epoch cannot be counted: set max_steps "
            "(and leave epochs unset), the stream cycles"
        )


def refuse_iterable_epochs(config: TrainingConfig) -> None:
    """An ``IterableDataset`` training set has no length: it cycles for ``max_steps`` steps, so
    it needs them and refuses ``epochs``."""
    why = "the training set is an IterableDataset, whose length is not known"
    if config.epochs is not None:
        raise ValueError(
            f"epochs={config.epochs}: {why}, so its epochs cannot be counted: leave epochs unset "
            "and set max_steps, the dataset is iterated again (set_epoch(n) first, if it has "
            "one) until the run has trained max_steps steps"
        )
    if config.max_steps is None:
        raise ValueError(
            f"max_steps: {why}, so an epoch cannot be counted: set max_steps (and leave epochs "
            "unset), the dataset is iterated again as often as the run needs"
        )


def stream_cycles(stream: StreamSpec, config: TrainingConfig) -> bool:
    """Whether the training stream cycles (see the module docstring); refuses a config that
    cannot train on it."""
    counted = stream.format == "tokens" or all(s.samples is not None for s in stream.shards)
    if not counted:
        refuse_uncounted_epochs(config)
    return not counted or (config.epochs is None and config.max_steps is not None)


def _load_streams(
    train_spec: DatasetSpec,
    validation_spec: DatasetSpec | None,
    config: TrainingConfig,
    replica: tuple[int, int],
) -> Datasets:
    """A streamed training set and its validation (see the module docstring)."""
    from ace3.runtime.data.stream import ShardStream, split_shards

    assert train_spec.stream is not None
    rank, world = replica
    cycle = stream_cycles(train_spec.stream, config)
    notes: list[str] = []
    validation: Dataset[Any] | None
    if validation_spec is not None:
        files = [shard.file for shard in train_spec.stream.shards]
        validation = _validation_set(validation_spec, config, replica)
    else:
        files, held_out = split_shards(train_spec, config)
        validation = None
        if held_out:
            validation = ShardStream(
                train_spec, split="validation", files=held_out, config=config, rank=rank,
                world_size=world, cycle=False,
            )  # fmt: skip
            notes.append(
                f"validation: {len(held_out)} of the dataset's {len(train_spec.stream.shards)} "
                "shards held out"
            )
        elif config.validation_split != 0:
            notes.append(
                "validation: none (the streamed dataset has a single shard, which cannot be "
                "held out: give a validation dataset to validate)"
            )
    train = ShardStream(
        train_spec, split="train", files=files, config=config, rank=rank, world_size=world,
        cycle=cycle,
    )  # fmt: skip
    return Datasets(train, validation, tuple(notes))


def _validation_set(
    spec: DatasetSpec, config: TrainingConfig, replica: tuple[int, int]
) -> Dataset[Any]:
    """A validation dataset: streamed (every shard, one pass), or loaded whole."""
    if spec.stream is not None:
        from ace3.runtime.data.stream import ShardStream

        files = [shard.file for shard in spec.stream.shards]
        return ShardStream(
            spec, split="validation", files=files, config=config, rank=replica[0],
            world_size=replica[1], cycle=False,
        )  # fmt: skip
    validation = load_dataset(spec, "validation", replica)
    if validation is None:
        raise ValueError(f"{spec.path}: build_dataset('validation') returned None")
    return validation


def load_datasets(
    train_spec: DatasetSpec,
    validation_spec: DatasetSpec | None,
    config: TrainingConfig,
    replica: tuple[int, int] = (0, 1),
) -> Datasets:
    """Training and (optional) validation datasets, as described in the module docstring;
    ``replica`` (this rank's data replica, how many there are) places a stream's readers and is
    what a dataset.py's ``build_dataset`` gets as ``rank`` and ``world_size``."""
    if train_spec.stream is not None:
        return _load_streams(train_spec, validation_spec, config, replica)
    train = load_dataset(train_spec, "train", replica)
    if train is None:
        raise ValueError(f"{train_spec.path}: build_dataset('train') returned None")
    if isinstance(train, IterableDataset):
        refuse_iterable_epochs(config)
    if validation_spec is not None:
        return Datasets(train, _validation_set(validation_spec, config, replica))
    if config.validation_split and isinstance(train, IterableDataset):
        raise ValueError(
            f"validation_split={config.validation_split}: the training set is an "
            "IterableDataset, of which no fraction can be held out: return a 'validation' "
            "split from build_dataset, give a validation dataset, or leave validation_split "
            "unset (no validation) or 0"
        )
    if config.validation_split:  # an explicit fraction
        train, validation = split_holdout(train, config.validation_split, config.seed)
        return Datasets(train, validation)
    train_path = Path(train_spec.path)
    if train_path.is_dir() and (train_path / "dataset.py").is_file():
        validation = load_dataset(train_spec, "validation", replica)
        if validation is not None:
            return Datasets(train, validation)
    if isinstance(train, IterableDataset):
        note = "validation: none (no fraction of an IterableDataset can be held out: return a "
        note += "'validation' split from build_dataset, or give a validation dataset)"
        return Datasets(train, None, (note,) if config.validation_split is None else ())
    if config.validation_split is None:  # the default: hold out a little rather than not validate
        train, validation = split_holdout(train, DEFAULT_VALIDATION_SPLIT, config.seed)
        return Datasets(train, validation)
    return Datasets(train, None)
