"""Tokenizing a ``.jsonl`` file of text records once per node, not once per rank.

The node's leader (local rank 0) reads and tokenizes the file, as one rank alone would, and
writes the examples' token ids and labels to ``scratch`` (a directory of the attempt's own
``TMPDIR``, one per node: the sandbox's ``tmp/``): ``ids.bin`` and ``labels.bin`` (int32, the
examples one after another), ``offsets.bin`` (int64, ``count + 1`` boundaries) and, last, by a
rename, ``meta.json`` (the records' kind and the example count, or the error that stopped it).
Every rank waits at a barrier of all ranks; then the others memory-map the arrays (the pages
are the node's page cache, shared, not a copy per rank) and read them as the same examples, in
the same order, with the same values: what each rank tokenized before, bit for bit. A
tokenizing error (a bad record, a chat template missing) is raised by every rank with the
leader's message. The leader always writes anew before the barrier, so files left by an earlier
launch of the same attempt are never read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from ace3.config.text_records import RecordKind
from ace3.runtime.data.text_records import TokenizedExample, read_records, tokenize_records

META = "meta.json"
ARRAYS = ("ids", "labels", "offsets")


@dataclass(frozen=True)
class Once:
    """How this rank tokenizes once per node: ``scratch``, the node's directory for a file's
    examples; ``leader``, whether this rank tokenizes (local rank 0); ``wait``, a barrier of
    every rank."""

    scratch: Path
    leader: bool
    wait: Callable[[], None]

    def at(self, name: str) -> Once:
        """The same, for the file called ``name`` (its own subdirectory)."""
        return Once(self.scratch / name, self.leader, self.wait)


def tokenize_file(
    path: Path, tokenizer: Any, named: RecordKind | None = None
) -> tuple[RecordKind, list[TokenizedExample]]:
    """Read and tokenize every record of ``path`` (one process alone)."""
    kind, records = read_records(path, named)
    return kind, tokenize_records(records, kind, tokenizer)


class TokenArrays(Sequence[TokenizedExample]):
    """The examples of a scratch directory, memory-mapped; pickled by path (a DataLoader
    worker maps the files again)."""

    def __init__(self, directory: Path, size: int) -> None:
        self.directory = directory
        self.size = size
        self._open()

    def _open(self) -> None:
        def mapped(name: str, dtype: type) -> np.ndarray:
            path = self.directory / f"{name}.bin"
            if path.stat().st_size == 0:
                return np.zeros(0, dtype=dtype)
            return np.memmap(path, dtype=dtype, mode="r").view(np.ndarray)

        self.ids = mapped("ids", np.int32)
        self.labels = mapped("labels", np.int32)
        self.offsets = mapped("offsets", np.int64)
        if len(self.offsets) != self.size + 1:
            raise ValueError(f"{self.directory}: tokenized examples are incomplete")

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "size": self.size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.directory, self.size = state["directory"], state["size"]
        self._open()

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> TokenizedExample: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[TokenizedExample]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.size))]
        if not -self.size <= index < self.size:
            raise IndexError(index)
        index %= self.size
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return TokenizedExample(
            input_ids=self.ids[start:end].tolist(), labels=self.labels[start:end].tolist()
        )

    def __iter__(self) -> Iterator[TokenizedExample]:
        return (self[i] for i in range(self.size))


def write_examples(directory: Path, examples: Sequence[TokenizedExample]) -> None:
    """The examples' arrays into ``directory`` (written example by example: no second copy)."""
    offsets = [0]
    with (directory / "ids.bin").open("wb") as ids, (directory / "labels.bin").open("wb") as lab:
        for example in examples:
            np.asarray(example.input_ids, dtype=np.int32).tofile(ids)
            np.asarray(example.labels, dtype=np.int32).tofile(lab)
            offsets.append(offsets[-1] + len(example.input_ids))
    np.asarray(offsets, dtype=np.int64).tofile(directory / "offsets.bin")


def _write_meta(directory: Path, meta: dict[str, Any]) -> None:
    temp = directory / f".{META}.tmp"
    temp.write_text(json.dumps(meta), encoding="utf-8")
    os.replace(temp, directory / META)


def tokenize_once(
    path: Path,
    tokenizer: Any,
    named: RecordKind | None,
    once: Once | None,
) -> tuple[RecordKind, Sequence[TokenizedExample]]:
    """The file's records' kind and tokenized examples: tokenized by the node's leader when
    ``once`` is given (see the module docstring), else here."""
    if once is None:
        return tokenize_file(path, tokenizer, named)
    scratch = once.scratch
    result: tuple[RecordKind, list[TokenizedExample]] | None = None
    if once.leader:
        (scratch / META).unlink(missing_ok=True)
        scratch.mkdir(parents=True, exist_ok=True)
        try:
            result = tokenize_file(path, tokenizer, named)
        except ValueError as exc:
            _write_meta(scratch, {"error": str(exc)})
        else:
            write_examples(scratch, result[1])
            _write_meta(scratch, {"kind": result[0], "count": len(result[1])})
    once.wait()
    meta = json.loads((scratch / META).read_text(encoding="utf-8"))
    if "error" in meta:
        raise ValueError(meta["error"])
    if result is not None:
        return result
    return meta["kind"], TokenArrays(scratch, int(meta["count"]))
