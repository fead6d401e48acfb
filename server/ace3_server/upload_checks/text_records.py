"""Text records in a ``.jsonl`` dataset, for language models: chat (OpenAI's format,
``{"messages": [{"role": ..., "content": ...}, ...]}``), prompt/completion (``{"prompt": ...,
"completion": ...}``) and plain text (``{"text": ...}``). The kind is told by the first record,
or named (``records=``: then a record need only hold that kind's fields, whatever else it holds);
the first records are checked for its shape (a 422 naming the line and the field): every record
of one kind, chats as :mod:`ace3.config.chat_messages` says (roles among
system/user/assistant/tool/developer with string contents, an assistant turn to learn from,
typed and bounded tool calls and ``tools``), string prompts, completions and texts. The job
tokenizes them with the model's own tokenizer (:mod:`ace3.runtime.data.text_records`)."""

from __future__ import annotations

from typing import Any

from ace3.config.chat_messages import CHAT_ROLES, check_chat_record
from ace3.config.text_records import RecordKind, has_kind_fields, text_record_kind
from ace3_server.upload_checks.errors import UploadCheckError

__all__ = ["ROLES", "RecordKind", "check_text_record", "text_record_kind"]
ROLES = CHAT_ROLES
_EXPECTED = (
    '{"messages": [{"role": ..., "content": ...}, ...]}, {"prompt": ..., "completion": ...} '
    'or {"text": ...}'
)


def _check_chat(record: dict[str, Any], line_no: int) -> None:
    try:
        check_chat_record(record)
    except ValueError as exc:
        raise UploadCheckError(f"line {line_no}: {exc}") from exc


def check_text_record(
    record: object, kind: RecordKind, line_no: int, *, named: bool = False
) -> None:
    """Refuse a record that is not of ``kind``'s shape, naming the line (``named``: the kind
    was named with ``records=``, so the record need only hold its fields)."""
    if named:
        if not has_kind_fields(record, kind):
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise UploadCheckError(
                f"line {line_no}: records={kind!r}, but this record (with {keys}) is not a "
                f"{kind} record ({_EXPECTED})"
            )
    else:
        found = text_record_kind(record)
        if found != kind:
            raise UploadCheckError(
                f"line {line_no}: expected a {kind} record like the first one, not "
                f"{found or 'this'} ({_EXPECTED})"
            )
    assert isinstance(record, dict)
    if kind == "chat":
        _check_chat(record, line_no)
        return
    fields = ("prompt", "completion") if kind == "prompt_completion" else ("text",)
    for field in fields:
        if not isinstance(record.get(field), str):
            raise UploadCheckError(f"line {line_no}: {field!r} must be a string")
