"""Which records of a ``.jsonl`` dataset are text records for a language model, one rule for
the API that checks an upload (``ace3_server.upload_checks.text_records``) and the job that
reads it (``ace3.runtime.data.text_datasets``): chat (OpenAI's format, ``{"messages": [...]}``),
prompt/completion (``{"prompt": ..., "completion": ...}``) and plain text (``{"text": ...}``).
A record with ``"inputs"`` is an (inputs, target) record, whatever else it holds.

A dataset may also name its kind (``records=`` at upload or registration): then each record
need only hold that kind's fields (:func:`has_kind_fields`), whatever else it holds."""

from __future__ import annotations

from typing import Literal

RecordKind = Literal["chat", "prompt_completion", "text"]
RECORD_KINDS: tuple[RecordKind, ...] = ("chat", "prompt_completion", "text")
KIND_FIELDS: dict[RecordKind, tuple[str, ...]] = {
    "chat": ("messages",),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
}


def has_kind_fields(record: object, kind: RecordKind) -> bool:
    """Whether ``record`` holds the fields of a named ``kind`` (their types are checked apart)."""
    return isinstance(record, dict) and all(key in record for key in KIND_FIELDS[kind])


def named_layout(kind: RecordKind) -> dict[str, object]:
    """A dataset's batch layout (its row's ``batch_layout``) when its records were named."""
    return {"kind": "records", "records": kind, "named": True}


def named_records(layout: object) -> RecordKind | None:
    """The kind a dataset's batch layout names (``records=``), None when none was named."""
    if isinstance(layout, dict) and layout.get("named") and layout.get("records") in RECORD_KINDS:
        kind: RecordKind = layout["records"]
        return kind
    return None


def text_record_kind(record: object) -> RecordKind | None:
    """The kind of a text record, None for anything else (an (inputs, target) record)."""
    if not isinstance(record, dict) or "inputs" in record:
        return None
    if "messages" in record:
        return "chat"
    if "prompt" in record or "completion" in record:
        return "prompt_completion"
    if "text" in record:
        return "text"
    return None
