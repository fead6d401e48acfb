"""``ace3.DataLoader``: a ``torch.utils.data.DataLoader`` that takes the tuning options
everywhere instead of failing where they do not apply.

- ``pin_memory`` is honoured only when CUDA is available (pinned memory only speeds up copies
  to a GPU); elsewhere it is off, silently.
- ``prefetch_factor`` and ``persistent_workers`` only mean something with worker processes;
  with ``num_workers=0`` they are ignored instead of raising.
- ``num_workers`` above this machine's usable CPUs is capped to them, with one warning (more
  processes than cores only adds contention).

``loader.options`` keeps what was asked for (a :class:`DataLoaderOptions`), so a trainer can
rebuild a loader with the same settings over its own sampler; the torch attributes
(``num_workers``, ``pin_memory``, ...) hold what is in effect.

``dataset`` may also be a local dataset path (a ``.pt``/``.npz``/``.csv``/``.jsonl`` file or a
directory, read as the engine reads job datasets: its ``train`` split).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import IterableDataset


def usable_cpu_count() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class DataLoaderOptions:
    """The options a :class:`DataLoader` was asked for (before capping and ignoring)."""

    batch_size: int | None
    shuffle: bool
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    drop_last: bool
    extra: dict[str, Any] = field(default_factory=dict)  # other torch DataLoader arguments


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an int >= {minimum}{extra}, got {value!r}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def resolve_dataset(dataset: Any) -> Any:
    """A torch dataset for ``dataset``: itself, or the ``train`` split of a local path."""
    if isinstance(dataset, (str, os.PathLike)):
        from ace3.runtime.data.datasets import load_dataset
        from ace3.runtime.job_spec import DatasetSpec

        path = Path(dataset)
        if not path.exists():
            raise FileNotFoundError(f"dataset: {path} does not exist")
        return load_dataset(DatasetSpec(path=str(path)), "train")
    if type(dataset).__name__ == "DatasetRef" and hasattr(dataset, "client"):
        local = getattr(dataset, "local_path", None)
        if local is not None and Path(local).exists():
            return resolve_dataset(Path(local))
        raise TypeError(
            "dataset: an uploaded dataset (client.load_dataset) lives on the service; pass it "
            "to trainer.train(...), or give ace3.DataLoader a torch Dataset or the local path "
            "of the data file or directory"
        )
    if isinstance(dataset, IterableDataset):
        return dataset
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise TypeError(
            "dataset must be a torch Dataset (with __len__ and __getitem__), an IterableDataset, "
            f"or a local dataset path, got {type(dataset).__name__}"
        )
    return dataset


class DataLoader(TorchDataLoader):
    """A torch ``DataLoader`` with forgiving tuning options (see the module docstring)."""

    options: DataLoaderOptions

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool = False,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        drop_last: bool = False,
        **kwargs: Any,
    ) -> None:
        _check_int("batch_size", batch_size, 1, allow_none=True)
        _check_int("num_workers", num_workers, 0)
        _check_int("prefetch_factor", prefetch_factor, 1, allow_none=True)
        for name, value in (
            ("shuffle", shuffle),
            ("pin_memory", pin_memory),
            ("persistent_workers", persistent_workers),
            ("drop_last", drop_last),
        ):
            _check_bool(name, value)
        options = DataLoaderOptions(
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=num_workers,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            drop_last=drop_last,
            extra=dict(kwargs),
        )
        cpus = usable_cpu_count()
        workers = num_workers
        if num_workers > cpus:
            workers = cpus
            warnings.warn(
                f"ace3.DataLoader: num_workers={num_workers} is more than the {cpus} CPU(s) "
                f"this process can use; using num_workers={cpus}",
                UserWarning,
                stacklevel=2,
            )
        if workers == 0:
            prefetch_factor, persistent_workers = None, False
        super().__init__(
            resolve_dataset(dataset),
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=workers,
            pin_memory=pin_memory and torch.cuda.is_available(),
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            drop_last=drop_last,
            **kwargs,
        )
        self.options = options
