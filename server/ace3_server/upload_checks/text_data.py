"""``.csv`` and ``.jsonl`` datasets: the header and the first rows or records, read as the engine
reads them (``ace3.runtime.data.dataset_files.load_csv`` / ``jsonl_pair``), from at most
:data:`HEAD_BYTES` of the file.

Only what is certain from the head is refused: text that is not UTF-8, a CSV without a header
of two columns or more, a row whose cell count differs from the header's, a cell that is not a
number, a JSONL line that is not JSON or not a record ``{"inputs": ..., "target": ...}`` (or
``"targets"``, ``"label"``) of numbers, records whose inputs differ in shape, and a file with no
data at all; a JSONL file of text records (chat, prompt/completion, text) is checked by
:mod:`.text_records`. The rest of the file is the engine's to read.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ace3_server.upload_checks.errors import UploadCheckError
from ace3_server.upload_checks.text_records import RecordKind, check_text_record, text_record_kind

HEAD_BYTES = 1 << 20
FIRST_ROWS = 200
# The engine's names (ace3.runtime.data.dataset_files; the server cannot import it).
CSV_TARGET_COLUMNS = ("target", "label")
JSONL_TARGET_KEYS = ("target", "targets", "label")
_Shape = tuple[int, ...]


def _head_lines(path: Path) -> tuple[str, bool]:
    """The file's first whole lines, at most HEAD_BYTES of them, decoded, and whether that is
    the whole file. A line cut by the window is left out (it is not checked)."""
    with path.open("rb") as handle:
        raw = handle.read(HEAD_BYTES + 1)
    whole = len(raw) <= HEAD_BYTES
    if not whole:
        raw = raw[: raw.rfind(b"\n", 0, HEAD_BYTES) + 1]
    try:
        return raw.decode("utf-8"), whole
    except UnicodeDecodeError as exc:
        raise UploadCheckError(
            f"not UTF-8 text (byte {exc.start} is {raw[exc.start : exc.start + 1]!r})"
        ) from None


def check_csv(path: Path) -> None:
    """Check a CSV dataset's header and first rows."""
    text, whole = _head_lines(path)
    if not text and not whole:
        return  # a header line longer than the window: nothing certain to say
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as exc:
        raise UploadCheckError(f"not readable as CSV: {exc}") from exc
    if not whole and rows:
        rows.pop()  # (the window may end inside a quoted cell: the last row is not judged)
    if not rows or not rows[0]:
        raise UploadCheckError("empty CSV file; expected a header row and data rows")
    header = [name.strip() for name in rows[0]]
    if len(header) < 2:
        raise UploadCheckError(
            f"the header has {len(header)} column; expected at least one feature column and "
            f"a target column ({' or '.join(CSV_TARGET_COLUMNS)}, else the last)"
        )
    data_rows = 0
    for line, row in enumerate(rows[1 : FIRST_ROWS + 1], start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        data_rows += 1
        if len(row) != len(header):
            raise UploadCheckError(
                f"line {line} has {len(row)} cells but the header has {len(header)}"
            )
        for index, cell in enumerate(row):
            try:
                float(cell)
            except ValueError:
                raise UploadCheckError(
                    f"line {line}, column {header[index]!r}: {cell!r} is not a number (every "
                    "CSV cell must be numeric)"
                ) from None
    if data_rows == 0 and whole and len(rows) <= FIRST_ROWS + 1:
        raise UploadCheckError("no data rows after the header")


def _numeric_shape(value: object, depth: int = 0) -> _Shape | None:
    """The shape of a number or of nested equal-length lists of numbers; None otherwise."""
    if isinstance(value, (int, float)):  # (bool is an int: torch.tensor takes it)
        return ()
    if not isinstance(value, list) or depth > 32:
        return None
    shapes = {_numeric_shape(item, depth + 1) for item in value}
    if None in shapes or len(shapes) > 1:
        return None
    inner = shapes.pop() if shapes else ()
    return None if inner is None else (len(value), *inner)


def _record_shapes(line: str, line_no: int) -> tuple[_Shape, _Shape]:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UploadCheckError(f"line {line_no} is not valid JSON: {exc}") from None
    if not isinstance(record, dict) or "inputs" not in record:
        raise UploadCheckError(
            f'line {line_no}: expected {{"inputs": [...], "target": ...}} (or text records for '
            'a language model: {"messages": [...]}, {"prompt", "completion"} or {"text"})'
        )
    key = next((k for k in JSONL_TARGET_KEYS if k in record), None)
    if key is None:
        raise UploadCheckError(f"line {line_no}: no 'target' (or 'targets', 'label') key")
    shapes = []
    for name in ("inputs", key):
        shape = _numeric_shape(record[name])
        if shape is None:
            raise UploadCheckError(
                f"line {line_no}: {name!r} must be a number or nested lists of numbers of "
                "equal lengths"
            )
        shapes.append(shape)
    return shapes[0], shapes[1]


def _first_record(lines: list[str]) -> object:
    for line in lines:
        if line.strip():
            try:
                return json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                return None  # (the checks below name the line)
    return None


def _check_text_records(lines: list[str], kind: RecordKind, named: bool = False) -> RecordKind:
    for line_no, line in enumerate(lines[:FIRST_ROWS], start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise UploadCheckError(f"line {line_no} is not valid JSON: {exc}") from None
        check_text_record(record, kind, line_no, named=named)
    return kind


class RecordsError(UploadCheckError):
    """The records are not of the kind named with ``records=`` (a 422 on ``records``)."""


UNKNOWN = "unknown"
"""What :func:`check_jsonl` returns when no whole record fits in the head it reads."""


def check_jsonl(path: Path, named: RecordKind | None = None) -> RecordKind | str | None:
    """Check a JSON-lines dataset's first records: text records (returns their kind:
    :mod:`.text_records`), else (inputs, target) records (returns None); :data:`UNKNOWN` when
    the first record is longer than the head read. ``named``: the kind named at upload,
    which the first records must be (a :class:`RecordsError` naming the line)."""
    text, whole = _head_lines(path)
    lines = list(io.StringIO(text, newline=None))  # (the engine's text-mode lines)
    if named is not None:
        if whole and not any(line.strip() for line in lines):
            raise RecordsError(f"records={named!r}, but the file holds no records")
        try:
            return _check_text_records(lines, named, named=True)
        except UploadCheckError as exc:
            raise RecordsError(str(exc)) from None
    if not whole and not any(line.strip() for line in lines):
        return UNKNOWN  # (a first record longer than the head: its kind is not known here)
    kind = text_record_kind(_first_record(lines))
    if kind is not None:
        return _check_text_records(lines, kind)
    first: tuple[int, _Shape, _Shape] | None = None
    records = 0
    for line_no, line in enumerate(lines[:FIRST_ROWS], start=1):
        if not line.strip():
            continue
        inputs, target = _record_shapes(line, line_no)
        records += 1
        if first is None:
            first = (line_no, inputs, target)
        elif (inputs, target) != first[1:]:
            raise UploadCheckError(
                f"line {line_no}: inputs of shape {list(inputs)} and target of shape "
                f"{list(target)}, but line {first[0]} has {list(first[1])} and "
                f"{list(first[2])}; every record's must match"
            )
    if records == 0 and whole and len(lines) <= FIRST_ROWS:
        raise UploadCheckError("no records; expected one JSON object a line")
    return None
