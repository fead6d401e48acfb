"""Text records for language-model fine-tuning: chat, prompt/completion and plain text in JSONL.

A record is one JSON object per line: ``{"messages": [{"role", "content"}, ...]}`` (OpenAI's
chat format, with tool calls and ``tools``: :mod:`ace3.config.chat_messages`),
``{"prompt", "completion"}`` or ``{"text"}``. This module reads and checks
them, and gathers the public names of the pieces that tokenize (``text_masking``) and batch
(``text_packing``) them, so the engine imports one module. It runs inside the job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ace3.config.chat_messages import CHAT_ROLES, check_chat_record
from ace3.config.text_records import has_kind_fields
from ace3.runtime.data.text_masking import (
    IGNORE_INDEX,
    RECORD_KINDS,
    RecordKind,
    TokenizedExample,
    chat_template_of,
    tokenize_record,
)
from ace3.runtime.data.text_packing import (
    TextReport,
    TokenizedTextDataset,
    collate_text,
    padding_tokens,
)

__all__ = [
    "CHAT_ROLES",
    "IGNORE_INDEX",
    "RECORD_KINDS",
    "RecordKind",
    "TextReport",
    "TokenizedExample",
    "TokenizedTextDataset",
    "chat_template_of",
    "check_record",
    "collate_text",
    "detect_record_kind",
    "padding_tokens",
    "read_numbered_records",
    "read_records",
    "tokenize_record",
    "tokenize_records",
]

# How many records detection looks at: enough to catch a file that mixes kinds early.
DETECTION_RECORDS = 100
EXPECTED = (
    '{"messages": [{"role": ..., "content": ...}, ...]} (chat), '
    '{"prompt": ..., "completion": ...} or {"text": ...}'
)


def kind_of(record: Any) -> RecordKind | None:
    """The kind a record's keys say, or None when they match none."""
    if not isinstance(record, dict):
        return None
    if "messages" in record:
        return "chat"
    if "prompt" in record and "completion" in record:
        return "prompt_completion"
    if "text" in record:
        return "text"
    return None


def detect_record_kind(records: Iterable[dict[str, Any]]) -> RecordKind:
    """The one kind of the first records; ``ValueError`` naming the (1-based) line otherwise."""
    return _detect_numbered(enumerate(records, start=1))


def _detect_numbered(numbered: Iterable[tuple[int, Any]]) -> RecordKind:
    detected: RecordKind | None = None
    for position, (line, record) in enumerate(numbered, start=1):
        if position > DETECTION_RECORDS:
            break
        kind = kind_of(record)
        if kind is None:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(f"line {line}: a record with {keys} is none of {EXPECTED}")
        if detected is None:
            detected = kind
        elif kind != detected:
            raise ValueError(
                f"line {line}: a {kind} record among {detected} records; "
                "a dataset holds one kind of text record"
            )
    if detected is None:
        raise ValueError(f"no records: expected lines of {EXPECTED}")
    return detected


def check_record(record: Any, kind: RecordKind, *, named: bool = False) -> None:
    """Raise ``ValueError`` saying what is wrong when ``record`` is not of ``kind``'s shape
    (``named``: the dataset named its kind, so the record need only hold its fields)."""
    if (not has_kind_fields(record, kind)) if named else kind_of(record) != kind:
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"a record with {keys} is not a {kind} record; expected {EXPECTED}")
    if kind == "text":
        if not isinstance(record["text"], str):
            raise ValueError('"text" must be a string')
    elif kind == "prompt_completion":
        for key in ("prompt", "completion"):
            if not isinstance(record[key], str):
                raise ValueError(f'"{key}" must be a string')
    else:
        check_chat_record(record)


def read_records(
    path: Path, kind: RecordKind | None = None
) -> tuple[RecordKind, list[dict[str, Any]]]:
    """Read a ``.jsonl`` file of text records (blank lines skipped), each checked for its kind.

    ``kind`` names the kind (the dataset's ``records=``: each record need only hold its
    fields); without it the first records decide. Errors name the file and the (1-based) line.
    """
    kind, numbered = read_numbered_records(path, kind)
    return kind, [record for _, record in numbered]


def read_numbered_records(
    path: Path, kind: RecordKind | None = None
) -> tuple[RecordKind, list[tuple[int, dict[str, Any]]]]:
    """:func:`read_records`, each record with its (1-based) line."""
    numbered: list[tuple[int, Any]] = []
    with open(path, encoding="utf-8") as stream:
        for line_number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                numbered.append((line_number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}, line {line_number}: not valid JSON ({exc})") from exc
    named = kind is not None
    if kind is None:
        try:
            kind = _detect_numbered(numbered)
        except ValueError as exc:
            raise ValueError(f"{path}, {exc}") from exc
    elif kind not in RECORD_KINDS:
        raise ValueError(f"unknown record kind {kind!r}; expected one of {list(RECORD_KINDS)}")
    for line_number, record in numbered:
        try:
            check_record(record, kind, named=named)
        except ValueError as exc:
            raise ValueError(f"{path}, line {line_number}: {exc}") from exc
    return kind, numbered


def tokenize_records(
    records: Iterable[dict[str, Any]],
    kind: RecordKind,
    tokenizer: Any,
    lines: tuple[Path, Sequence[int]] | None = None,
) -> list[TokenizedExample]:
    """``tokenize_record`` over records, errors naming the (1-based) record that failed, and
    its file and line when ``lines`` gives them (the file, each record's line)."""
    if kind == "chat":
        chat_template_of(tokenizer)  # refuse once, before any record, without a template
    examples: list[TokenizedExample] = []
    for number, record in enumerate(records, start=1):
        try:
            examples.append(tokenize_record(record, kind, tokenizer))
        except ValueError as exc:
            where = f" ({lines[0]}, line {lines[1][number - 1]})" if lines else ""
            raise ValueError(f"record {number}{where}: {exc}") from exc
    return examples
