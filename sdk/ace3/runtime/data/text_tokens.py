"""Tokenizing a ``.jsonl`` file of text records once per node, not once per rank.

The node's leader (local rank 0) reads and tokenizes the file, as one rank alone would, and
writes the examples' token ids and labels to ``scratch`` (a directory of the attempt's own
``TMPDIR``, one per node: the sandbox's ``tmp/``): ``ids.bin`` and ``labels.bin`` (int32, the
examples one after another: 8 bytes a token), ``offsets.bin`` (int64, ``count + 1``
boundaries) and, last, by a rename, ``meta.json`` (the records' kind and the example count, or
the error that stopped it: any exception, written before the leader raises it). The other
ranks of the node wait for ``meta.json`` by polling the file, with no time limit (tokenizing a
large file may take longer than the process group's timeout, so no collective waits for it; if
the leader dies, torchrun stops the node's other ranks), then memory-map the arrays and read
them as the same examples, in the same order, with the same values: what each rank tokenized
before, bit for bit. Each rank still builds its own items (tensors) from them: what is saved is
the parsing and tokenizing, not the memory of the items. A tokenizing error (a bad record, a
chat template missing) is raised by every rank with the leader's message.

Before any file is tokenized (:meth:`Once.start`), the leader removes what an earlier launch of
the same attempt left, and every rank meets at a barrier (at once: nobody tokenizes before it),
so no rank reads an earlier launch's files. Once every rank has built its datasets,
:meth:`Once.finish` meets again and the leader deletes the directory: its disk is taken only
while the datasets are built.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from ace3.config.text_records import RecordKind
from ace3.runtime.data.text_records import (
    TokenizedExample,
    read_numbered_records,
    tokenize_records,
)

META = "meta.json"
ARRAYS = ("ids", "labels", "offsets")


@dataclass(frozen=True)
class Once:
    """How this rank tokenizes once per node: ``scratch``, the node's directory for a file's
    examples; ``leader``, whether this rank tokenizes (local rank 0); ``wait``, a barrier of
    every rank (met before any file is tokenized and after the datasets are built, never while
    one is tokenized)."""

    scratch: Path
    leader: bool
    wait: Callable[[], None]
    poll_seconds: float = 0.5

    def at(self, name: str) -> Once:
        """The same, for the file called ``name`` (its own subdirectory)."""
        return Once(self.scratch / name, self.leader, self.wait, self.poll_seconds)

    def start(self) -> None:
        """Before any file is tokenized: the leader removes an earlier launch's files, and every
        rank waits for it (every rank calls it)."""
        if self.leader:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch.mkdir(parents=True)
        self.wait()

    def finish(self) -> None:
        """Once every rank has built its datasets from the scratch files: the leader deletes
        them (every rank calls it)."""
        self.wait()
        if self.leader:
            shutil.rmtree(self.scratch, ignore_errors=True)


def tokenize_file(
    path: Path, tokenizer: Any, named: RecordKind | None = None
) -> tuple[RecordKind, list[TokenizedExample]]:
    """Read and tokenize every record of ``path`` (one process alone)."""
    kind, numbered = read_numbered_records(path, named)
    lines = (path, [line for line, _ in numbered])
    return kind, tokenize_records([record for _, record in numbered], kind, tokenizer, lines)


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
    ``once`` is given (after :meth:`Once.start`; see the module docstring), else here."""
    if once is None:
        return tokenize_file(path, tokenizer, named)
    scratch = once.scratch
    if once.leader:  # (Once.start removed an earlier launch's files)
        scratch.mkdir(parents=True, exist_ok=True)
        return _lead(path, tokenizer, named, scratch)
    meta = _wait_for_meta(scratch, once.poll_seconds)
    if "error" in meta:
        error = str(meta["error"])
        if meta.get("type") == "ValueError":
            raise ValueError(error)
        raise RuntimeError(f"tokenizing {path.name} failed on this node's local rank 0: {error}")
    return meta["kind"], TokenArrays(scratch, int(meta["count"]))


def _lead(
    path: Path, tokenizer: Any, named: RecordKind | None, scratch: Path
) -> tuple[RecordKind, list[TokenizedExample]]:
    """The leader's part: tokenize, write the arrays and then ``meta.json``; on any error,
    ``meta.json`` saying it (the arrays removed) before the error is raised."""
    meta: dict[str, Any] | None = None
    try:
        result = tokenize_file(path, tokenizer, named)
        write_examples(scratch, result[1])
        meta = {"kind": result[0], "count": len(result[1])}
        return result
    except BaseException as exc:
        for name in ARRAYS:
            (scratch / f"{name}.bin").unlink(missing_ok=True)
        if isinstance(exc, ValueError):
            meta = {"error": str(exc), "type": "ValueError"}
        else:
            meta = {"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__}
        raise
    finally:
        if meta is not None:
            _write_meta(scratch, meta)


def _wait_for_meta(scratch: Path, poll_seconds: float) -> dict[str, Any]:
    """``meta.json`` once the leader has written it (no time limit: see the module docstring)."""
    path = scratch / META
    while True:
        try:
            meta: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            time.sleep(poll_seconds)
            continue
        return meta
