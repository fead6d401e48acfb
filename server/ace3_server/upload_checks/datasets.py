"""Dispatch an uploaded dataset to its format's checker: a file by its format, a directory by
the data files the engine would read from it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ace3.config.text_records import RecordKind, named_layout
from ace3_server.upload_checks.errors import UploadCheckError
from ace3_server.upload_checks.npz import check_npz
from ace3_server.upload_checks.text_data import UNKNOWN, RecordsError, check_csv, check_jsonl
from ace3_server.upload_checks.torch_pickle import check_pt

CHECKERS: dict[str, Callable[[Path], object]] = {
    "pt": check_pt,
    "npz": check_npz,
    "csv": check_csv,
    "jsonl": check_jsonl,
}
# The engine's suffixes for a directory's one data file (ace3.runtime.data.dataset_files).
DIRECTORY_SUFFIXES = {".pt": "pt", ".pth": "pt", ".npz": "npz", ".csv": "csv", ".jsonl": "jsonl"}


def check_dataset_file(
    path: Path, data_format: str, records: RecordKind | None = None
) -> dict[str, Any] | None:
    """Run the checker of ``data_format`` on ``path``; :class:`UploadCheckError` on a problem.
    Returns the engine's batch layout for it: (inputs, targets) pairs, or text records of a
    kind (a ``.jsonl`` of chat, prompt/completion or text records, for language models).
    ``records``: the kind of text records named at upload (a ``.jsonl`` only; a
    :class:`RecordsError` otherwise, or when its first records are not of that kind)."""
    if records is not None:
        if data_format != "jsonl":
            raise RecordsError(
                f"records={records!r} names the kind of a .jsonl file's text records; this is "
                f"a {data_format} file: leave records out"
            )
        check_jsonl(path, records)
        return named_layout(records)
    found = CHECKERS[data_format](path)
    if found == UNKNOWN:
        return None  # (the job reads it whole: nothing is certain here)
    if isinstance(found, str):
        return {"kind": "records", "records": found}
    return {"kind": "pair"}


def check_dataset_tree(tree: Path, records: RecordKind | None = None) -> dict[str, Any] | None:
    """A directory without a ``dataset.py`` is read from its one top-level data file (the
    engine's rule): check that file, naming it, and return its batch layout. With a
    ``dataset.py``, or any other number of data files, nothing is certain here (the engine's own
    message says which): None. ``records`` (the kind named at upload) needs that one file to be
    a ``.jsonl``."""
    files = [
        p
        for p in tree.iterdir()
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in DIRECTORY_SUFFIXES
    ]
    if (tree / "dataset.py").is_file() or len(files) != 1:
        if records is not None:
            raise RecordsError(
                f"records={records!r} names the kind of a .jsonl file's text records; this "
                "directory is not read from one .jsonl file (it has a dataset.py, or another "
                "number of data files): leave records out"
            )
        return None
    try:
        return check_dataset_file(files[0], DIRECTORY_SUFFIXES[files[0].suffix.lower()], records)
    except RecordsError as exc:
        raise RecordsError(f"{files[0].name}: {exc}") from None
    except UploadCheckError as exc:
        raise UploadCheckError(f"{files[0].name}: {exc}") from None
