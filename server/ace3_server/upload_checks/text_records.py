"""Text records in a ``.jsonl`` dataset, for language models: chat (OpenAI's format,
``{"messages": [{"role": ..., "content": ...}, ...]}``), prompt/completion (``{"prompt": ...,
"completion": ...}``) and plain text (``{"text": ...}``). The kind is told by the first record,
or named (``records=``: then a record need only hold that kind's fields, whatever else it holds);
the first records are checked for its shape (a 422 naming the line): every record of one kind,
roles among system/user/assistant/tool with string contents, a chat with an assistant turn to
learn from, string prompts, completions and texts. The job tokenizes them with the model's own
tokenizer (:mod:`ace3.runtime.data.text_records`)."""

from __future__ import annotations

from typing import Any

from ace3.config.text_records import RecordKind, has_kind_fields, text_record_kind
from ace3_server.upload_checks.errors import UploadCheckError

__all__ = ["ROLES", "RecordKind", "check_text_record", "text_record_kind"]
ROLES = ("system", "user", "assistant", "tool")
_EXPECTED = (
    '{"messages": [{"role": ..., "content": ...}, ...]}, {"prompt": ..., "completion": ...} '
    'or {"text": ...}'
)


def _check_chat(record: dict[str, Any], line_no: int) -> None:
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise UploadCheckError(f"line {line_no}: 'messages' must be a non-empty list")
    for index, message in enumerate(messages):
        where = f"line {line_no}: messages[{index}]"
        if not isinstance(message, dict):
            raise UploadCheckError(f'{where} must be an object {{"role": ..., "content": ...}}')
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise UploadCheckError(f"{where}: role {role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise UploadCheckError(f"{where}: 'content' must be a string")
    if not any(message["role"] == "assistant" for message in messages):
        raise UploadCheckError(
            f"line {line_no}: a chat with no assistant turn has nothing for the model to learn"
        )


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
