"""Tool calls in chat records, for the chat template and after it: the messages as a Hugging Face
template expects them, and the check that the template rendered the calls where the model
learns them (a template that drops ``tool_calls`` must not train silently on text without them).

The record has been checked by :mod:`ace3.config.chat_messages`; this module runs in the job.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

Result = TypeVar("Result")


def has_tools(messages: list[dict[str, Any]], tools: object) -> bool:
    """Whether a chat holds tool calls, tool results or a ``tools`` list."""
    return bool(tools) or any(
        message.get("tool_calls") or message["role"] == "tool" for message in messages
    )


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as Hugging Face chat templates expect them: each call's ``arguments`` the
    JSON object itself rather than OpenAI's JSON string (templates write ``arguments | tojson``;
    a string would be written quoted), a null ``content`` beside tool calls an empty string, and
    OpenAI's ``developer`` role as ``system``, which templates know."""
    converted = []
    for message in messages:
        message = dict(message)
        if message["role"] == "developer":
            message["role"] = "system"
        if message.get("tool_calls"):
            if message.get("content") is None:
                message["content"] = ""
            message["tool_calls"] = [
                {
                    **call,
                    "type": "function",
                    "function": {
                        **call["function"],
                        "arguments": json.loads(call["function"]["arguments"]),
                    },
                }
                for call in message["tool_calls"]
            ]
        converted.append(message)
    return converted


def rendering_tools(render: Callable[[], Result], tool_chat: bool) -> Result:
    """``render()``, with an error the chat template raised turned into a ``ValueError`` that
    says so (the caller names the record): on a chat with tool calls, that the template cannot
    render them; on any other, what it raised (a template's ``raise_exception``: many refuse a
    system message, or turns that do not alternate user and assistant)."""
    try:
        return render()
    except (ValueError, MemoryError):
        raise
    except Exception as exc:  # jinja2's TemplateError, a template's raise_exception, ...
        if tool_chat:
            raise ValueError(
                "the model's chat template cannot render this chat's tool calls or tool "
                f"messages ({type(exc).__name__}: {exc}); use a model whose chat template "
                "renders OpenAI-style tool_calls and tool messages, or leave them out of the "
                "records"
            ) from exc
        raise ValueError(
            f"the model's chat template raised {type(exc).__name__}: {exc} (templates often "
            "refuse a system message, or turns that do not alternate user and assistant); "
            "change the record, or use a model whose chat template renders it"
        ) from exc


def check_tool_calls_rendered(
    messages: list[dict[str, Any]], input_ids: list[int], learned: Sequence[bool], tokenizer: Any
) -> None:
    """Refuse an example whose template dropped a tool call from what the model learns (each
    call's function name must be in the learned text) or a tool result from the conversation."""
    spans: list[str] = []
    span: list[int] = []
    for token, is_learned in zip(input_ids, learned, strict=True):
        if is_learned:
            span.append(token)
        elif span:
            spans.append(tokenizer.decode(span))
            span = []
    if span:
        spans.append(tokenizer.decode(span))
    learned_text = "\n".join(spans)
    rendered = tokenizer.decode(input_ids)
    for index, message in enumerate(messages):
        for call in message.get("tool_calls") or ():
            name = call["function"]["name"]
            if name not in learned_text:
                raise ValueError(
                    f"messages[{index}]: the tool call {name!r} is not in the text the model "
                    "learns: the model's chat template drops tool_calls (or renders them "
                    "outside its {% generation %} blocks); use a chat template that renders "
                    "them, or leave them out of the records"
                )
        content = message["content"].strip() if message["role"] == "tool" else ""
        escaped = json.dumps(content, ensure_ascii=False)[1:-1]  # as `tojson` would write it
        if content and content not in rendered and escaped not in rendered:
            raise ValueError(
                f"messages[{index}]: the tool result is not in the rendered chat: the model's "
                "chat template drops tool messages; use a chat template that renders them"
            )
