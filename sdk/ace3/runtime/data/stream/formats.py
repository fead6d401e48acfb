"""Reading one shard file of a streamed dataset: its samples from a sample index on.

Every format reads a shard as a sequence of samples numbered from 0, and can start at any
sample: ``tokens`` and ``parquet`` seek there (the token windows are computed, the parquet
footer says which row group holds a row) without decoding what comes before; ``jsonl`` counts
lines and ``webdataset`` tar members without decoding them. A sample is:

- parquet, jsonl: ``(inputs, targets)`` tensors, as today's dataset files give (floats and
  bools float32, integers int64; a list column is one more dimension); jsonl of text records
  (``records``): ``(file name, line number, the parsed record)``, tokenized by
  :mod:`.text`;
- tokens: ``{"input_ids", "labels"}``, int64 ``[L]`` (a window of L + 1 token ids, stride L;
  labels are the next tokens, or, for a model that shifts them itself, the input ids);
- webdataset: a dict keyed by extension (:mod:`.webdataset`).

Errors name the file (and the line, row group or member).
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Generator, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ace3.runtime.data.dataset_files import jsonl_pair, normalize_dtype
from ace3.runtime.data.stream.webdataset import webdataset_samples
from ace3.runtime.job_spec import StreamSpec

DEFAULT_COLUMNS = {"inputs": "inputs", "targets": "targets"}
# The longest line of a text record in a shard (characters): registered shards are not read at
# registration, so a record is bounded here, before it is parsed or tokenized.
MAX_RECORD_LINE_CHARS = 64 * 2**20
TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def token_samples(size: int, dtype: str, sequence_length: int) -> int:
    """Windows of ``sequence_length + 1`` tokens at stride ``sequence_length`` in a tokens shard
    of ``size`` bytes."""
    tokens = size // np.dtype(TOKEN_DTYPES[dtype]).itemsize
    return max(0, (tokens - 1) // sequence_length)


class ShardFormat:
    """How the shards of one stream are read (its format, dtype, columns, sequence length)."""

    def __init__(
        self, stream: StreamSpec, sequence_length: int | None, records: bool = False
    ) -> None:
        self.format = stream.format
        # jsonl of text records: each sample is the parsed record (a dict), tokenized later
        self.records = records and stream.format == "jsonl"
        self.dtype = stream.dtype or "uint16"
        self.columns = dict(DEFAULT_COLUMNS)
        for role, column in (stream.columns or {}).items():
            self.columns[role] = column
        if self.format == "tokens" and sequence_length is None:
            raise ValueError("sequence_length: a 'tokens' dataset needs it (tokens per sample)")
        self.sequence_length = sequence_length or 0
        self.labels_are_inputs = stream.labels == "inputs"  # (the model shifts them itself)

    def count(self, size: int, recorded: int | None) -> int | None:
        """The shard's samples, when known before reading it."""
        if self.format == "tokens":
            return token_samples(size, self.dtype, self.sequence_length)
        return None if self.records else recorded

    def samples(self, path: Path, start: int = 0) -> Generator[Any, None, None]:
        """The shard's samples from index ``start`` on."""
        if self.format == "tokens":
            return self._tokens(path, start)
        if self.format == "parquet":
            return self._parquet(path, start)
        if self.records:
            return _jsonl_objects(path, start)
        if self.format == "jsonl":
            return _jsonl(path, start)
        return webdataset_samples(path, start)

    def take(self, path: Path, indices: Iterable[int]) -> dict[int, Any]:
        """The samples at ``indices`` (a shuffle buffer restored by the samples' identity), by
        one pass from the smallest."""
        wanted = sorted(set(indices))
        if not wanted:
            return {}
        found: dict[int, Any] = {}
        if self.format == "tokens":
            tokens = self._token_array(path)
            return {i: self._window(tokens, i) for i in wanted}
        for index, sample in enumerate(self.samples(path, wanted[0]), start=wanted[0]):
            if index in wanted:
                found[index] = sample
                if len(found) == len(wanted):
                    break
        missing = [i for i in wanted if i not in found]
        if missing:
            raise ValueError(f"{path}: has no sample {missing[0]} (the shard is shorter)")
        return found

    # -- tokens ---------------------------------------------------------------------------------

    def _token_array(self, path: Path) -> np.ndarray:
        dtype = np.dtype(TOKEN_DTYPES[self.dtype])
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise ValueError(
                f"{path}: {size} bytes is not a whole number of {self.dtype} tokens "
                f"({dtype.itemsize} bytes each): the file is truncated or has another dtype"
            )
        if size == 0:
            return np.zeros(0, dtype=dtype)
        # (a plain array over the mapping: slicing a np.memmap costs a subclass's bookkeeping)
        return np.memmap(path, dtype=dtype, mode="r").view(np.ndarray)

    def _window(self, tokens: np.ndarray, index: int) -> dict[str, torch.Tensor]:
        length = self.sequence_length
        # One copy, widened to int64; input_ids and labels are views of it (a batch stacks them
        # into tensors of its own).
        span = tokens[index * length : index * length + length + 1]
        window = torch.from_numpy(np.asarray(span, dtype=np.int64))
        if self.labels_are_inputs:
            return {"input_ids": window[:-1], "labels": window[:-1]}
        return {"input_ids": window[:-1], "labels": window[1:]}

    def _tokens(self, path: Path, start: int) -> Generator[dict[str, torch.Tensor], None, None]:
        tokens = self._token_array(path)
        count = max(0, (len(tokens) - 1) // self.sequence_length)
        for index in range(start, count):
            yield self._window(tokens, index)

    # -- parquet --------------------------------------------------------------------------------

    def _parquet(
        self, path: Path, start: int
    ) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
        import pyarrow.parquet as pq

        try:
            handle = pq.ParquetFile(path)
        except Exception as exc:
            raise ValueError(f"{path}: not a readable parquet file: {exc}") from exc
        with handle:
            names = handle.schema_arrow.names
            wanted = [self.columns["inputs"], self.columns["targets"]]
            for name in wanted:
                if name not in names:
                    raise ValueError(
                        f"{path}: no column {name!r} (columns: {names}); name the columns with "
                        "columns={'inputs': ..., 'targets': ...}"
                    )
            first = 0
            for group in range(handle.metadata.num_row_groups):
                rows = handle.metadata.row_group(group).num_rows
                if first + rows <= start:
                    first += rows
                    continue
                try:
                    table = handle.read_row_group(group, columns=wanted)
                except Exception as exc:
                    raise ValueError(f"{path}: row group {group} is unreadable: {exc}") from exc
                inputs = _column(table.column(wanted[0]), path, wanted[0])
                targets = _column(table.column(wanted[1]), path, wanted[1])
                for row in range(max(0, start - first), rows):
                    yield inputs[row].clone(), targets[row].clone()
                first += rows


def _column(column: Any, path: Path, name: str) -> torch.Tensor:
    """A parquet column as a tensor ``[rows, ...]``: a list column (of equal lengths) is one
    more dimension; nulls are refused."""
    import pyarrow as pa
    import pyarrow.types as pat

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if array.null_count:
        raise ValueError(f"{path}: column {name!r} has null values")
    shape = [len(array)]
    while pat.is_list(array.type) or pat.is_large_list(array.type):
        lengths = np.unique(array.value_lengths().to_numpy(zero_copy_only=False))
        if len(lengths) > 1:
            raise ValueError(f"{path}: column {name!r} holds lists of different lengths")
        shape.append(int(lengths[0]) if len(lengths) else 0)
        array = array.flatten()
        if array.null_count:
            raise ValueError(f"{path}: column {name!r} has null values")
    while pat.is_fixed_size_list(array.type):
        shape.append(array.type.list_size)
        array = array.flatten()
    if not (
        pat.is_integer(array.type) or pat.is_floating(array.type) or pat.is_boolean(array.type)
    ):
        raise ValueError(f"{path}: column {name!r} is {array.type}, not numbers")
    values = np.asarray(array.to_numpy(zero_copy_only=False))
    return normalize_dtype(torch.from_numpy(values.copy()).reshape(shape))


# -- jsonl ---------------------------------------------------------------------------------------


def _open_text(path: Path) -> io.TextIOBase:
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    if path.name.endswith(".zst"):
        import zstandard

        raw = zstandard.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)
        return io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8")
    return path.open(encoding="utf-8")


def _lines(
    path: Path, start: int, limit: int | None = None
) -> Generator[tuple[int, str], None, None]:
    """The shard's non-blank lines (with their 1-based numbers) from the ``start``-th on; a
    line longer than ``limit`` characters is a ValueError naming it (read no further)."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, UnicodeDecodeError)
    if path.name.endswith(".zst"):
        import zstandard

        errors += (zstandard.ZstdError,)
    index = 0
    line_no = 0
    try:
        with _open_text(path) as handle:
            while line := handle.readline(-1 if limit is None else limit + 1):
                line_no += 1
                if limit is not None and len(line) > limit and not line.endswith("\n"):
                    raise ValueError(
                        f"{path}, line {line_no}: longer than {limit:,} characters; a text "
                        "record is at most that long: shorten or split it"
                    )
                if not line.strip():
                    continue
                index += 1
                if index > start:  # skipped lines are counted, not parsed
                    yield line_no, line
    except errors as exc:
        raise ValueError(f"{path}: unreadable after line {line_no}: {exc}") from exc


def _jsonl(path: Path, start: int) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
    for line_no, line in _lines(path, start):
        pair = jsonl_pair(line, path, line_no)
        if pair is not None:
            yield _tensor(pair[0], path, line_no), _tensor(pair[1], path, line_no)


def _jsonl_objects(path: Path, start: int) -> Generator[tuple[str, int, Any], None, None]:
    """Text records: ``(file name, line number, parsed JSON)``, checked later (by kind); a
    line is at most :data:`MAX_RECORD_LINE_CHARS` characters."""
    for line_no, line in _lines(path, start, MAX_RECORD_LINE_CHARS):
        try:
            yield path.name, line_no, json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {line_no}: not valid JSON ({exc})") from exc


def _tensor(value: Any, path: Path, line_no: int) -> torch.Tensor:
    try:
        return normalize_dtype(torch.as_tensor(np.asarray(value)))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: line {line_no}: not numbers of one shape: {exc}") from exc
