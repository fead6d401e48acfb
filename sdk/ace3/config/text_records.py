"""Which records of a ``.jsonl`` dataset are text records for a language model, one rule for
the API that checks an upload (``ace3_server.upload_checks.text_records``) and the job that
reads it (``ace3.runtime.data.text_datasets``): chat (OpenAI's format, ``{"messages": [...]}``),
prompt/completion (``{"prompt": ..., "completion": ...}``) and plain text (``{"text": ...}``).
A record with ``"inputs"`` is an (inputs, target) record, whatever else it holds."""

from __future__ import annotations

from typing import Literal

RecordKind = Literal["chat", "prompt_completion", "text"]


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
