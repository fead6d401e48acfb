"""Batching streamed samples: :func:`stream_collate`, the DataLoader's ``collate_fn``.

- ``(inputs, targets)`` tuples (parquet, jsonl) become ``(inputs [B, ...], targets [B, ...])``;
- dicts (tokens, webdataset) become a dict of the same keys: tensors stacked (``[B, ...]``),
  numbers a tensor ``[B]``, anything else (text, raw bytes, parsed JSON) a list of B values.

Tensors of different dtypes in one batch are promoted to a common one (a jsonl shard may give
``[1, 2]`` in one record and ``[0.5, 2]`` in the next); tensors of different shapes are refused
with the key's name.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch


def stream_collate(samples: Sequence[Any]) -> Any:
    if not samples:
        raise ValueError("cannot collate an empty batch")
    first = samples[0]
    if isinstance(first, Mapping):
        keys = list(first)
        for number, sample in enumerate(samples):
            if not isinstance(sample, Mapping) or set(sample) != set(keys):
                raise ValueError(
                    f"sample {number} of the batch has keys {sorted(sample)}, "
                    f"the first has {sorted(keys)}"
                )
        return {key: _collate_values([s[key] for s in samples], repr(key)) for key in keys}
    if isinstance(first, (tuple, list)):
        width = len(first)
        if any(not isinstance(s, (tuple, list)) or len(s) != width for s in samples):
            raise ValueError("the batch's samples are not all tuples of the same length")
        return tuple(_collate_values([s[i] for s in samples], f"item {i}") for i in range(width))
    return _collate_values(list(samples), "samples")


def _collate_values(values: list[Any], what: str) -> Any:
    if all(isinstance(v, torch.Tensor) for v in values):
        first = values[0]
        if all(v.dtype == first.dtype and v.shape == first.shape for v in values):
            return torch.stack(values)  # (the common case, a sample's tensors all alike)
        dtype = functools.reduce(torch.promote_types, (v.dtype for v in values))
        shapes = {tuple(v.shape) for v in values}
        if len(shapes) > 1:
            raise ValueError(f"cannot stack {what}: its tensors have shapes {sorted(shapes)}")
        return torch.stack([v.to(dtype) for v in values])
    if all(isinstance(v, (bool, int, float)) for v in values):
        return torch.tensor(values)
    return values
