"""The shape of a chat record (OpenAI's format, tool calls included), one rule for the API that
checks an upload (``ace3_server.upload_checks.text_records``) and the job that reads it
(``ace3.runtime.data.text_records``).

A chat record is ``{"messages": [...], "tools": [...]}`` (``tools`` optional, OpenAI's
fine-tuning format). A message has a role among :data:`CHAT_ROLES` and a string ``content``;
an assistant message may carry ``tool_calls`` (``[{"id", "type": "function", "function":
{"name", "arguments"}}]``), and then its ``content`` may be null; a ``tool`` message answers a
call (``tool_call_id``). ``arguments`` is a JSON string as OpenAI sends it, and must parse to
a JSON object: the job hands the template the object, as Hugging Face templates expect. A null
or empty ``tool_calls`` (OpenAI's own ``ChatCompletionMessage.model_dump()`` writes
``"tool_calls": null``) and a null ``tools`` are as if absent. An assistant message may carry
OpenAI's ``weight``, 0 or 1: ``0`` means its turn is not learned (a chat must keep one learned
assistant turn). :func:`check_chat_record` raises ``ValueError`` naming the field (``messages[2].tool_calls[0]
.function``); each caller names the line."""

from __future__ import annotations

import json
from typing import Any

# "developer" is OpenAI's newer name for the system role; the job renders it as "system".
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")
MAX_TOOL_CALLS = 128  # per assistant message
MAX_TOOLS = 128  # per record
_CALL_SHAPE = '{"id": ..., "type": "function", "function": {"name": ..., "arguments": "{...}"}}'
_TOOL_SHAPE = '{"type": "function", "function": {"name": ..., "parameters": {...}}}'


def check_chat_record(record: dict[str, Any]) -> None:
    """Raise ``ValueError`` saying which field of a chat record is not of its shape."""
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for index, message in enumerate(messages):
        _check_message(message, f"messages[{index}]")
    assistant = [message for message in messages if message["role"] == "assistant"]
    if not assistant:
        raise ValueError("a chat with no assistant turn has nothing for the model to learn")
    if not any(learned_turn(message) for message in assistant):
        raise ValueError(
            "every assistant turn has weight 0: the chat has nothing for the model to learn"
        )
    if record.get("tools") is not None:
        _check_tools(record["tools"])


def learned_turn(message: dict[str, Any]) -> bool:
    """Whether a (checked) assistant message's turn is learned: its ``weight`` is not 0."""
    return bool(message.get("weight", 1) != 0)


def has_tool_calls(message: dict[str, Any]) -> bool:
    """Whether a message carries tool calls (a null or empty ``tool_calls`` is none)."""
    return message.get("tool_calls") not in (None, [])


def _check_message(message: object, where: str) -> None:
    if not isinstance(message, dict):
        raise ValueError(f'{where} must be an object {{"role": ..., "content": ...}}')
    role, content = message.get("role"), message.get("content")
    if role not in CHAT_ROLES:
        raise ValueError(f"{where}: role {role!r} is not one of {', '.join(CHAT_ROLES)}")
    if "weight" in message:
        weight = message["weight"]
        if role != "assistant":
            raise ValueError(
                f"{where}.weight: only an assistant message has a weight, not {role!r}"
            )
        if type(weight) is not int or weight not in (0, 1):
            raise ValueError(
                f"{where}.weight must be 0 (do not learn this turn) or 1, not {weight!r}"
            )
    if has_tool_calls(message):
        if role != "assistant":
            raise ValueError(f"{where}: only an assistant message has 'tool_calls', not {role!r}")
        _check_tool_calls(message["tool_calls"], where)
        if content is not None and not isinstance(content, str):
            raise ValueError(f"{where}: 'content' must be a string or null")
    elif not isinstance(content, str):
        raise ValueError(f"{where}: 'content' must be a string")
    if role == "tool" and not isinstance(message.get("tool_call_id", ""), str):
        raise ValueError(f"{where}: 'tool_call_id' must be a string")


def _check_tool_calls(calls: object, where: str) -> None:
    if not isinstance(calls, list) or not 0 < len(calls) <= MAX_TOOL_CALLS:
        raise ValueError(
            f"{where}: 'tool_calls' must be a non-empty list of at most {MAX_TOOL_CALLS} calls"
        )
    for number, call in enumerate(calls):
        at = f"{where}.tool_calls[{number}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise ValueError(f"{at} must be an object {_CALL_SHAPE}")
        if call.get("type", "function") != "function":
            raise ValueError(f"{at}: 'type' must be \"function\", not {call['type']!r}")
        if not isinstance(call.get("id", ""), str):
            raise ValueError(f"{at}: 'id' must be a string")
        function = call["function"]
        _check_name(function, f"{at}.function")
        arguments = function.get("arguments")
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else None
        except json.JSONDecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise ValueError(
                f"{at}.function: 'arguments' must be a string holding a JSON object "
                '(OpenAI\'s format), like "{\\"city\\": \\"Paris\\"}"'
            )


def _check_name(function: dict[str, Any], at: str) -> None:
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{at}: 'name' must be a non-empty string")


def _check_tools(tools: object) -> None:
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ValueError(f"'tools' must be a list of at most {MAX_TOOLS} {_TOOL_SHAPE}")
    for number, tool in enumerate(tools):
        at = f"tools[{number}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise ValueError(f"{at} must be an object {_TOOL_SHAPE}")
        if tool.get("type", "function") != "function":
            raise ValueError(f"{at}: 'type' must be \"function\", not {tool['type']!r}")
        function = tool["function"]
        _check_name(function, f"{at}.function")
        if not isinstance(function.get("description", ""), str):
            raise ValueError(f"{at}.function: 'description' must be a string")
        if not isinstance(function.get("parameters", {}), dict):
            raise ValueError(f"{at}.function: 'parameters' must be an object (a JSON schema)")
