"""Read one dataset file (.pt, .npz, .csv, .jsonl) into a ``TensorDataset`` of (inputs, targets).

Dtypes: floating arrays become float32; integer arrays become int64 (class ids, token ids);
booleans become float32. CSV cells are numbers: feature columns are float32, and the target
column is int64 when every value is a whole number, float32 otherwise.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

DATA_SUFFIXES = (".pt", ".pth", ".npz", ".csv", ".jsonl")
# Accepted (inputs, targets) key pairs for .npz files and .pt dicts, in order of preference.
KEY_PAIRS = (("inputs", "targets"), ("x", "y"), ("X", "y"), ("features", "labels"))
CSV_TARGET_COLUMNS = ("target", "label")
JSONL_TARGET_KEYS = ("target", "targets", "label")


def normalize_dtype(tensor: torch.Tensor) -> torch.Tensor:
    """float and bool -> float32, integers -> int64 (complex refused)."""
    if tensor.dtype.is_floating_point:
        return tensor.to(torch.float32)
    if tensor.dtype == torch.bool:
        return tensor.to(torch.float32)
    if tensor.dtype.is_complex:
        raise TypeError("complex-valued data is not supported")
    return tensor.to(torch.int64)


def _as_tensor(value: Any, path: Path, what: str) -> torch.Tensor:
    try:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu()
        else:
            tensor = torch.as_tensor(np.asarray(value))
        return normalize_dtype(tensor)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: cannot turn {what} into a numeric tensor: {exc}") from exc


def make_dataset(inputs: Any, targets: Any, path: Path) -> TensorDataset:
    """Build the (inputs, targets) dataset, checking that both have the same length."""
    x = _as_tensor(inputs, path, "inputs")
    y = _as_tensor(targets, path, "targets")
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(f"{path}: inputs and targets must have a leading sample dimension")
    if len(x) != len(y):
        raise ValueError(f"{path}: {len(x)} inputs but {len(y)} targets; they must match")
    if len(x) == 0:
        raise ValueError(f"{path}: the dataset is empty")
    return TensorDataset(x, y)


def _pick_pair(keys: Sequence[str], getter: Mapping[str, Any], path: Path) -> TensorDataset:
    for x_key, y_key in KEY_PAIRS:
        if x_key in keys and y_key in keys:
            return make_dataset(getter[x_key], getter[y_key], path)
    expected = " or ".join(f"{x}/{y}" for x, y in KEY_PAIRS)
    raise ValueError(f"{path}: expected keys {expected}; found {sorted(keys)}")


def load_pt(path: Path) -> TensorDataset:
    """``torch.save`` of ``{'inputs': X, 'targets': y}`` or of a tuple ``(X, y)``."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(
            f"{path}: cannot load with torch.load(weights_only=True) (only tensors and plain "
            f"containers are allowed): {exc}"
        ) from exc
    if isinstance(obj, Mapping):
        return _pick_pair(list(obj.keys()), obj, path)
    if isinstance(obj, (tuple, list)) and len(obj) == 2:
        return make_dataset(obj[0], obj[1], path)
    raise ValueError(
        f"{path}: expected a dict with 'inputs' and 'targets' or a tuple (inputs, targets), "
        f"got {type(obj).__name__}"
    )


def load_npz(path: Path) -> TensorDataset:
    """NumPy ``.npz`` with keys inputs/targets, x/y, X/y or features/labels."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except Exception as exc:
        raise ValueError(f"{path}: not a readable .npz archive (without pickles): {exc}") from exc
    return _pick_pair(list(arrays), arrays, path)


def _parse_float(cell: str, path: Path, line: int, column: str) -> float:
    try:
        return float(cell)
    except ValueError:
        raise ValueError(
            f"{path}: line {line}, column {column!r}: {cell!r} is not a number "
            "(every CSV cell must be numeric)"
        ) from None


def load_csv(path: Path) -> TensorDataset:
    """CSV with a header; target column 'target' or 'label', else the last column."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if not header:
            raise ValueError(f"{path}: empty CSV file; expected a header row and data rows")
        header = [name.strip() for name in header]
        if len(header) < 2:
            raise ValueError(f"{path}: expected at least one feature column and a target column")
        lowered = [name.lower() for name in header]
        target_idx = next(
            (lowered.index(name) for name in CSV_TARGET_COLUMNS if name in lowered),
            len(header) - 1,
        )
        features: list[list[float]] = []
        targets: list[float] = []
        for line, row in enumerate(reader, start=2):
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise ValueError(
                    f"{path}: line {line} has {len(row)} cells but the header has {len(header)}"
                )
            values = [_parse_float(c, path, line, header[i]) for i, c in enumerate(row)]
            targets.append(values[target_idx])
            features.append(values[:target_idx] + values[target_idx + 1 :])
    if not targets:
        raise ValueError(f"{path}: no data rows after the header")
    x = torch.tensor(features, dtype=torch.float32)
    whole = all(math.isfinite(t) and float(t).is_integer() for t in targets)
    y = torch.tensor(targets, dtype=torch.float64)
    y = y.to(torch.int64) if whole else y.to(torch.float32)
    return TensorDataset(x, y)


def jsonl_pair(line: str, path: Path, line_no: int) -> tuple[Any, Any] | None:
    """One line of a JSON-lines dataset: ``{"inputs": [...], "target": ...}`` (also "targets"
    or "label") as (inputs, target), or None for a blank line. Errors name the file and line."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: line {line_no} is not valid JSON: {exc}") from exc
    if not isinstance(record, dict) or "inputs" not in record:
        raise ValueError(f'{path}: line {line_no}: expected {{"inputs": [...], "target": ...}}')
    key = next((k for k in JSONL_TARGET_KEYS if k in record), None)
    if key is None:
        raise ValueError(f"{path}: line {line_no}: no 'target' (or 'targets', 'label') key")
    return record["inputs"], record[key]


def load_jsonl(path: Path) -> TensorDataset:
    """JSON lines ``{"inputs": [...], "target": ...}`` (also "targets" or "label")."""
    inputs: list[Any] = []
    targets: list[Any] = []
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            pair = jsonl_pair(line, path, line_no)
            if pair is not None:
                inputs.append(pair[0])
                targets.append(pair[1])
    if not inputs:
        raise ValueError(f"{path}: no records; expected one JSON object a line")
    try:
        x, y = torch.tensor(inputs), torch.tensor(targets)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{path}: every record's inputs must be numbers of the same shape: {exc}"
        ) from exc
    return make_dataset(x, y, path)


def load_data_file(path: Path) -> TensorDataset:
    """Dispatch on the file suffix."""
    suffix = path.suffix.lower()
    if suffix in (".pt", ".pth"):
        return load_pt(path)
    if suffix == ".npz":
        return load_npz(path)
    if suffix == ".csv":
        return load_csv(path)
    if suffix == ".jsonl":
        return load_jsonl(path)
    raise ValueError(
        f"{path}: unsupported dataset file type {suffix!r}; "
        f"expected one of {', '.join(DATA_SUFFIXES)}"
    )
