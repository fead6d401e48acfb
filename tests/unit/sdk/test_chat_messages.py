"""The shape of a chat record, tool calls included: the one rule the upload check and the job
share (``ace3.config.chat_messages``), each refusal naming the field."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from ace3.config.chat_messages import MAX_TOOL_CALLS, check_chat_record

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TOOL_CHAT: dict[str, Any] = {
    "messages": [
        {"role": "developer", "content": "you call tools"},
        {"role": "user", "content": "weather in paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'},
        {"role": "assistant", "content": "it is sunny"},
    ],
    "tools": [TOOL],
}


def _changed(path: str, value: object) -> dict[str, Any]:
    """TOOL_CHAT with the field at ``path`` (``messages.2.tool_calls.0.type``) set to
    ``value`` (``...`` deletes it)."""
    record = copy.deepcopy(TOOL_CHAT)
    *parents, last = path.split(".")
    target: Any = record
    for parent in parents:
        target = target[int(parent)] if isinstance(target, list) else target[parent]
    key: Any = int(last) if isinstance(target, list) else last
    if value is ...:
        del target[key]
    else:
        target[key] = value
    return record


def test_tool_calls_tool_results_tools_and_the_developer_role_are_accepted() -> None:
    check_chat_record(TOOL_CHAT)
    check_chat_record(_changed("messages.2.content", "let me look"))  # content beside calls
    check_chat_record(_changed("messages.2.content", ...))  # no content at all
    check_chat_record(_changed("tools", []))
    check_chat_record(_changed("messages.2.tool_calls", [CALL] * MAX_TOOL_CALLS))
    plain = _changed("tools.0.function", {"name": "get_weather"})  # no description, parameters
    check_chat_record(plain)


def test_null_or_empty_tool_calls_and_null_tools_are_as_if_absent() -> None:
    # OpenAI's ChatCompletionMessage.model_dump() writes "tool_calls": null.
    answered = _changed("messages.4.tool_calls", None)
    check_chat_record(answered)
    check_chat_record(_changed("messages.4.tool_calls", []))
    check_chat_record(_changed("messages.1.tool_calls", None))
    check_chat_record(_changed("tools", None))
    with pytest.raises(ValueError, match=re.escape("messages[4]: 'content' must be a string")):
        check_chat_record(_changed("messages.4.content", None) | {"tools": None})
    no_content = _changed("messages.2.content", None)
    no_content["messages"][2]["tool_calls"] = None  # no calls: content must be a string
    with pytest.raises(ValueError, match=re.escape("messages[2]: 'content' must be a string")):
        check_chat_record(no_content)


def test_a_weight_of_0_or_1_on_an_assistant_message_is_accepted() -> None:
    check_chat_record(_changed("messages.2.weight", 0))
    check_chat_record(_changed("messages.4.weight", 1))


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("messages.4.weight", 2, "messages[4].weight must be 0 (do not learn this turn) or 1"),
        ("messages.4.weight", 0.5, "messages[4].weight must be 0"),
        ("messages.4.weight", 1.0, "messages[4].weight must be 0"),
        ("messages.4.weight", True, "messages[4].weight must be 0"),
        ("messages.4.weight", None, "messages[4].weight must be 0"),
        ("messages.4.weight", "0", "messages[4].weight must be 0"),
        ("messages.1.weight", 0, "messages[1].weight: only an assistant message has a weight"),
        ("messages.3.weight", 1, "messages[3].weight: only an assistant message has a weight"),
    ],
)
def test_a_bad_weight_is_refused_naming_it(path: str, value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        check_chat_record(_changed(path, value))


def test_a_chat_whose_every_assistant_turn_has_weight_0_is_refused() -> None:
    record = _changed("messages.2.weight", 0)
    record["messages"][4]["weight"] = 0
    with pytest.raises(ValueError, match="every assistant turn has weight 0"):
        check_chat_record(record)


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("messages.0.role", "robot", "messages[0]: role 'robot' is not one of system, user"),
        ("messages.3.content", None, "messages[3]: 'content' must be a string"),
        ("messages.4.content", None, "messages[4]: 'content' must be a string"),
        ("messages.2.content", 3, "messages[2]: 'content' must be a string or null"),
        ("messages.3.tool_call_id", 7, "messages[3]: 'tool_call_id' must be a string"),
        ("messages.1.tool_calls", [CALL], "messages[1]: only an assistant message has"),
        ("messages.2.tool_calls", [CALL] * 129, "a non-empty list of at most 128 calls"),
        ("messages.2.tool_calls", "get_weather()", "'tool_calls' must be a non-empty list"),
        ("messages.2.tool_calls.0", "x", "messages[2].tool_calls[0] must be an object"),
        ("messages.2.tool_calls.0.function", ..., "messages[2].tool_calls[0] must be an object"),
        ("messages.2.tool_calls.0.type", "code", "tool_calls[0]: 'type' must be \"function\""),
        ("messages.2.tool_calls.0.id", 1, "messages[2].tool_calls[0]: 'id' must be a string"),
        ("messages.2.tool_calls.0.function.name", "", ".function: 'name' must be a non-empty"),
        ("messages.2.tool_calls.0.function.name", 5, "'name' must be a non-empty string"),
        ("messages.2.tool_calls.0.function.arguments", {"city": "Paris"}, "'arguments' must"),
        ("messages.2.tool_calls.0.function.arguments", "{city: Paris", "holding a JSON object"),
        ("messages.2.tool_calls.0.function.arguments", "[1, 2]", "holding a JSON object"),
        ("messages.2.tool_calls.0.function.arguments", ..., "holding a JSON object"),
        ("tools", {"get_weather": {}}, "'tools' must be a list of at most 128"),
        ("tools.0", "get_weather", "tools[0] must be an object"),
        ("tools.0.type", "retrieval", "tools[0]: 'type' must be \"function\""),
        ("tools.0.function.name", None, "tools[0].function: 'name' must be a non-empty string"),
        ("tools.0.function.description", 1, "tools[0].function: 'description' must be a string"),
        ("tools.0.function.parameters", "city", "'parameters' must be an object"),
    ],
)
def test_a_malformed_field_is_refused_naming_it(path: str, value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        check_chat_record(_changed(path, value))


def test_a_chat_whose_only_assistant_turns_are_missing_is_refused() -> None:
    record = {"messages": TOOL_CHAT["messages"][:2]}
    with pytest.raises(ValueError, match="no assistant turn"):
        check_chat_record(record)
