"""Resolve the job's training and validation datasets.

A dataset path is a data file (see :mod:`ace3.runtime.data.dataset_files`) or a directory holding
either a ``dataset.py`` that defines ``build_dataset(split)`` (split is ``'train'`` or
``'validation'``; it returns a map-style ``torch.utils.data.Dataset``, a tuple
``(inputs, targets)``, or ``None`` for no such split) or exactly one data file.

Validation data comes from ``validation_dataset``; else from holding out an explicit
``validation_split`` of the training data (a permutation seeded by ``config.seed``: the same on
every rank and every run); else from ``build_dataset('validation')`` of a ``dataset.py``; else,
when ``validation_split`` is left at its default (None), from holding out 10%. An explicit
``validation_split=0`` means no validation.
"""

from __future__ import annotations

import importlib.util
import sys
import zlib
from collections.abc import Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, Subset

from ace3.config import TrainingConfig
from ace3.runtime.data.dataset_files import DATA_SUFFIXES, load_data_file, make_dataset
from ace3.runtime.job_spec import DatasetSpec

Split = str  # 'train' or 'validation'


@dataclass(frozen=True)
class Datasets:
    train: Dataset[Any]
    validation: Dataset[Any] | None


def _check_map_style(dataset: Any, origin: str) -> Dataset[Any]:
    if not (hasattr(dataset, "__getitem__") and isinstance(dataset, Sized)):
        raise TypeError(
            f"{origin} must give a map-style dataset (with __len__ and __getitem__), "
            f"got {type(dataset).__name__}"
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


def _from_dataset_py(path: Path, split: Split) -> Dataset[Any] | None:
    module = _import_dataset_module(path)
    build = getattr(module, "build_dataset", None)
    if not callable(build):
        raise ValueError(f"{path} must define a function build_dataset(split)")
    result = build(split)
    if result is None:
        return None
    if isinstance(result, tuple) and len(result) == 2:
        return make_dataset(result[0], result[1], path)
    return _check_map_style(result, f"{path}: build_dataset({split!r})")


def _single_data_file(directory: Path) -> Path:
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


def load_dataset(spec: DatasetSpec, split: Split) -> Dataset[Any] | None:
    """Load one dataset; ``None`` only when a dataset.py has no such split."""
    path = Path(spec.path).resolve()
    if not path.exists():
        raise FileNotFoundError(f"dataset not found: {path}")
    if path.is_dir():
        script = path / "dataset.py"
        if script.is_file():
            return _from_dataset_py(script, split)
        path = _single_data_file(path)
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


def load_datasets(
    train_spec: DatasetSpec, validation_spec: DatasetSpec | None, config: TrainingConfig
) -> Datasets:
    """Training and (optional) validation datasets, as described in the module docstring."""
    train = load_dataset(train_spec, "train")
    if train is None:
        raise ValueError(f"{train_spec.path}: build_dataset('train') returned None")
    if validation_spec is not None:
        validation = load_dataset(validation_spec, "validation")
        if validation is None:
            raise ValueError(f"{validation_spec.path}: build_dataset('validation') returned None")
        return Datasets(train, validation)
    if config.validation_split:  # an explicit fraction
        train, validation = split_holdout(train, config.validation_split, config.seed)
        return Datasets(train, validation)
    train_path = Path(train_spec.path)
    if train_path.is_dir() and (train_path / "dataset.py").is_file():
        validation = load_dataset(train_spec, "validation")
        if validation is not None:
            return Datasets(train, validation)
    if config.validation_split is None:  # the default: hold out a little rather than not validate
        train, validation = split_holdout(train, DEFAULT_VALIDATION_SPLIT, config.seed)
        return Datasets(train, validation)
    return Datasets(train, None)
