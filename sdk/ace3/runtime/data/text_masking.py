"""Tokenize one text record with the model's own tokenizer and mask what the model should not learn.

Labels are never shifted: a Hugging Face causal LM shifts them itself (``labels[t]`` is
predicted from the logits at ``t - 1``), so ``labels[0]`` is never used and an example must
learn at least one token after its first to teach anything. The tokenizer is duck-typed (a
``transformers`` tokenizer); nothing here imports ``transformers``, so the module loads
without it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ace3.config.chat_messages import has_tool_calls, learned_turn
from ace3.config.text_records import RecordKind
from ace3.runtime.data.text_tool_calls import (
    check_tool_calls_rendered,
    has_tools,
    rendering_tools,
    template_messages,
)

RECORD_KINDS: tuple[RecordKind, ...] = ("chat", "prompt_completion", "text")
IGNORE_INDEX = -100
# `{% generation %}`, `{%- generation -%}`, ...: the blocks that give an assistant mask.
GENERATION_BLOCK = re.compile(r"{%-?\s*generation\s*-?%}")


@dataclass
class TokenizedExample:
    """One example's token ids, and per token the id to learn there or ``IGNORE_INDEX``."""

    input_ids: list[int]
    labels: list[int]


def learns_something(labels: Sequence[int]) -> bool:
    """Whether any label after the first is learned (the first is dropped by the model's shift)."""
    return any(label != IGNORE_INDEX for label in labels[1:])


def tokenize_record(record: dict[str, Any], kind: RecordKind, tokenizer: Any) -> TokenizedExample:
    """Tokenize a record of ``kind`` (already checked by ``read_records``) into ids and labels.

    Raises ``ValueError`` when the example would learn nothing, saying why, so that no
    example silently contributes nothing (or, alone in a batch, a NaN loss).
    """
    if kind == "chat":
        example = _tokenize_chat(record["messages"], tokenizer, record.get("tools") or None)
    elif kind == "prompt_completion":
        example = _tokenize_prompt_completion(record["prompt"], record["completion"], tokenizer)
    elif kind == "text":
        input_ids = _encode(tokenizer, record["text"]) + _eos(tokenizer)
        example = TokenizedExample(input_ids=input_ids, labels=list(input_ids))
        if not learns_something(example.labels):
            raise ValueError(
                f"the text tokenizes to {len(input_ids)} token(s): a causal LM learns nothing "
                "from fewer than 2 tokens; drop the record or give it more text"
            )
    else:
        raise ValueError(f"unknown record kind {kind!r}; expected one of {list(RECORD_KINDS)}")
    return example


def _encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without the tokenizer's own BOS/EOS (we add EOS ourselves)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _eos(tokenizer: Any) -> list[int]:
    eos_token_id = getattr(tokenizer, "eos_token_id", None)
    return [int(eos_token_id)] if eos_token_id is not None else []


def common_prefix_length(first: Sequence[int], second: Sequence[int]) -> int:
    length = 0
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        length += 1
    return length


def _tokenize_prompt_completion(prompt: str, completion: str, tokenizer: Any) -> TokenizedExample:
    """The prompt's tokens are ignored; the completion's tokens (and EOS) are learned.

    The rule at the boundary: the concatenation ``prompt + completion`` is tokenized once,
    and the first learned token is the first one that differs from the prompt tokenized
    alone. A token that merges the end of the prompt with the start of the completion is
    therefore learned (the model has to write its completion part), and no token the
    prompt's own tokenization holds unchanged is.
    """
    prompt_ids = _encode(tokenizer, prompt)
    input_ids = _encode(tokenizer, prompt + completion) + _eos(tokenizer)
    boundary = common_prefix_length(prompt_ids, input_ids)
    labels = [IGNORE_INDEX] * boundary + input_ids[boundary:]
    if not learns_something(labels):
        raise ValueError(
            "the completion adds no token to learn (it is empty and the tokenizer has no EOS "
            "token, or it merges into the prompt's tokens); give the record a completion"
        )
    return TokenizedExample(input_ids=input_ids, labels=labels)


def chat_template_of(tokenizer: Any) -> str:
    """The tokenizer's default chat template, or a clear refusal when it has none."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    if not isinstance(template, str) or not template.strip():
        raise ValueError(
            "the model's tokenizer has no chat template; chat records need one to be rendered "
            "(add a chat_template.jinja to the model directory, or use prompt/completion or "
            "text records)"
        )
    return template


def _tokenize_chat(
    record_messages: list[dict[str, Any]], tokenizer: Any, tools: list[Any] | None
) -> TokenizedExample:
    """Learn each assistant turn (its reply, its tool calls and end-of-turn tokens); ignore
    everything else (system, user and tool messages). ``tools`` goes to the template as
    ``tools=``; a template that cannot render the tool calls, or drops them, is an error.

    A template with ``{% generation %}`` blocks gives the mask itself. Otherwise (or when
    that mask is all zeros) each assistant turn is found by rendering the conversation up to
    it with ``add_generation_prompt=True`` and up to and including it: the tokens between
    the two are the reply. Trailing tokens after the last special token of that span (the
    newline ChatML writes after ``<|im_end|>``) are not learned when they are only
    whitespace: they are template separators the model never writes, since generation stops
    at the end-of-turn token.

    An assistant turn of ``weight`` 0 (OpenAI's format) is rendered but not learned. The
    template never sees ``weight``, nor a null or empty ``tool_calls``.
    """
    template = chat_template_of(tokenizer)
    skipped = {
        turn
        for turn, message in enumerate(record_messages)
        if message["role"] == "assistant" and not learned_turn(message)
    }
    messages = template_messages([_for_template(message) for message in record_messages])
    tool_chat = has_tools(messages, tools)
    example = rendering_tools(
        lambda: _chat_example(template, messages, tokenizer, tools, skipped), tool_chat
    )
    example = _checked_chat(example)
    if tool_chat:
        learned = [label != IGNORE_INDEX for label in example.labels]
        check_tool_calls_rendered(messages, example.input_ids, learned, tokenizer)
    return example


def _for_template(message: dict[str, Any]) -> dict[str, Any]:
    """The message without ``weight`` and without a null or empty ``tool_calls`` (templates
    test ``'tool_calls' in message``)."""
    dropped = {"weight"} if has_tool_calls(message) else {"weight", "tool_calls"}
    return {key: value for key, value in message.items() if key not in dropped}


def _chat_example(
    template: str,
    messages: list[dict[str, Any]],
    tokenizer: Any,
    tools: list[Any] | None,
    skipped: set[int],
) -> TokenizedExample:
    if GENERATION_BLOCK.search(template):
        rendered = tokenizer.apply_chat_template(
            messages,
            tools=tools,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        input_ids = [int(token) for token in rendered["input_ids"]]
        mask = list(rendered["assistant_masks"])
        if any(mask):
            for turn in sorted(skipped):  # weight 0: the turn's span, found as without blocks
                start, end = _turn_span(tokenizer, messages, turn, tools, input_ids)
                mask[start:end] = [0] * (end - start)
            labels = [
                token if learned else IGNORE_INDEX
                for token, learned in zip(input_ids, mask, strict=True)
            ]
            return TokenizedExample(input_ids=input_ids, labels=labels)
    return _chat_by_difference(messages, tokenizer, tools, skipped)


def _render_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    generation_prompt: bool,
    tools: list[Any] | None = None,
) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        tokenize=True,
        return_dict=True,
        add_generation_prompt=generation_prompt,
    )
    return [int(token) for token in rendered["input_ids"]]


def _special_ids(tokenizer: Any) -> set[int]:
    special = {int(token) for token in getattr(tokenizer, "all_special_ids", [])}
    for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            special.add(int(token_id))
    return special


def _prefix_ids(
    tokenizer: Any, messages: list[dict[str, Any]], turn: int, tools: list[Any] | None
) -> list[int]:
    """The tokens before assistant turn ``turn``: the conversation so far with the generation
    prompt (the template's assistant header), learned by nobody. Before a first turn (the
    chat opens with the assistant: transformers renders no empty conversation) it is what the
    turn rendered with an empty reply shares with the turn rendered with its reply: any default
    system prompt, BOS and the header."""
    if turn:
        return _render_ids(tokenizer, messages[:turn], True, tools)
    first = messages[0]
    empty = _render_ids(tokenizer, [{"role": first["role"], "content": ""}], False, tools)
    whole = _render_ids(tokenizer, [first], False, tools)
    return empty[: common_prefix_length(empty, whole)]


def _turn_span(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    turn: int,
    tools: list[Any] | None,
    input_ids: list[int],
) -> tuple[int, int]:
    """Where assistant message ``turn`` lies in ``input_ids`` (the whole chat rendered): from
    the end of the conversation before it with the generation prompt to the end of the
    conversation through it."""
    before = _prefix_ids(tokenizer, messages, turn, tools)
    through = _render_ids(tokenizer, messages[: turn + 1], False, tools)
    start = common_prefix_length(before, input_ids)
    end = common_prefix_length(through, input_ids)
    # A merge across a boundary may change a token or two; more means the template renders
    # earlier turns differently once later ones follow, and the spans would be wrong.
    if len(before) - start > 2 or len(through) - end > 2:
        raise ValueError(
            f"cannot find assistant turn {turn + 1} (message {turn + 1}): the chat template "
            "renders the conversation differently once later messages follow; use a "
            "template with {% generation %} blocks around the assistant replies"
        )
    return start, end


def _chat_by_difference(
    messages: list[dict[str, Any]],
    tokenizer: Any,
    tools: list[Any] | None,
    skipped: set[int],
) -> TokenizedExample:
    input_ids = _render_ids(tokenizer, messages, False, tools)
    labels = [IGNORE_INDEX] * len(input_ids)
    special_ids = _special_ids(tokenizer)
    for turn, message in enumerate(messages):
        if message["role"] != "assistant" or turn in skipped:
            continue
        start, end = _turn_span(tokenizer, messages, turn, tools, input_ids)
        last_special = max(
            (position for position in range(start, end) if input_ids[position] in special_ids),
            default=None,
        )
        if (
            last_special is not None
            and not tokenizer.decode(input_ids[last_special + 1 : end]).strip()
        ):
            end = last_special + 1
        labels[start:end] = input_ids[start:end]
    return TokenizedExample(input_ids=input_ids, labels=labels)


def _checked_chat(example: TokenizedExample) -> TokenizedExample:
    if not learns_something(example.labels):
        raise ValueError(
            "the chat's assistant turns give no token to learn (empty replies rendered to "
            "nothing by the chat template); give each assistant turn some content"
        )
    return example
