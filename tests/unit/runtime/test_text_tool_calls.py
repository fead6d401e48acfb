"""Tool calls in chat records, token by token: the assistant's calls are learned with its replies;
tool results, the ``tools`` list, user and system text never are; a template that cannot render
the calls (it raises, drops them, or leaves them outside its generation blocks) fails clearly.

A tiny byte-level BPE tokenizer is trained here on local text (no download), with ChatML
templates that render tool calls as ``<tool_call>{json}</tool_call>`` and tool results as a
``tool`` turn, one with ``{% generation %}`` blocks and one without.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ace3.runtime.data.text_records import (
    IGNORE_INDEX,
    TokenizedExample,
    read_records,
    tokenize_record,
    tokenize_records,
)

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

TOOLS_HEAD = (
    "{% if tools %}<|im_start|>system\n{% for tool in tools %}{{ tool | tojson }}\n"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
)
CALLS = (
    "{% for call in message['tool_calls'] or [] %}<tool_call>"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "</tool_call>{% endfor %}"
)
TAIL = "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
WITHOUT_GENERATION = TOOLS_HEAD + "{{ message['content'] }}" + CALLS + "<|im_end|>\n" + TAIL
WITH_GENERATION = (
    TOOLS_HEAD + "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] }}" + CALLS + "<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] }}<|im_end|>\n{% endif %}" + TAIL
)
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "paris"}'},
}
MESSAGES: list[dict[str, Any]] = [
    {"role": "developer", "content": "you are terse"},
    {"role": "user", "content": "what is the weather in paris"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'},
    {"role": "assistant", "content": "sunny in paris"},
]
RECORD = {"messages": MESSAGES, "tools": [TOOL]}
LEARNED = [
    '<tool_call>{"name": "get_weather", "arguments": {"city": "paris"}}</tool_call><|im_end|>',
    "sunny in paris<|im_end|>",
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    pre_tokenizers = tokenizers.pre_tokenizers
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<pad>", "<eos>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = [json.dumps(RECORD), "<tool_call></tool_call> the weather is sunny"]
    bpe.train_from_iterator(corpus * 10, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<eos>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )


def _with_template(tokenizer: Any, template: str) -> Any:
    tokenizer.chat_template = template
    return tokenizer


def _learned_text(tokenizer: Any, example: TokenizedExample) -> list[str]:
    """The learned spans, each decoded (consecutive learned tokens form one span)."""
    spans: list[list[int]] = []
    previous_learned = False
    for token, label in zip(example.input_ids, example.labels, strict=True):
        learned = label != IGNORE_INDEX
        if learned:
            assert label == token  # labels are never shifted
            if not previous_learned:
                spans.append([])
            spans[-1].append(token)
        previous_learned = learned
    return [tokenizer.decode(span) for span in spans]


@pytest.mark.parametrize("template", [WITH_GENERATION, WITHOUT_GENERATION])
def test_the_assistants_tool_calls_are_learned_and_tool_results_and_tools_never(
    tokenizer: Any, template: str
) -> None:
    example = tokenize_record(RECORD, "chat", _with_template(tokenizer, template))
    assert _learned_text(tokenizer, example) == LEARNED
    rendered = tokenizer.decode(example.input_ids)
    # tools= reached the template; arguments went in as the object, developer as system.
    assert rendered.startswith('<|im_start|>system\n{"type": "function", "function": {"name"')
    assert "<|im_start|>system\nyou are terse<|im_end|>" in rendered
    assert '<|im_start|>tool\n{"sky": "sunny"}<|im_end|>' in rendered


def test_both_templates_give_the_same_labels_and_a_chat_may_open_with_a_call(
    tokenizer: Any,
) -> None:
    by_blocks = tokenize_record(RECORD, "chat", _with_template(tokenizer, WITH_GENERATION))
    by_difference = tokenize_record(RECORD, "chat", _with_template(tokenizer, WITHOUT_GENERATION))
    assert by_blocks == by_difference
    opening = {"messages": MESSAGES[2:]}  # the chat opens with the assistant's call, no tools
    example = tokenize_record(opening, "chat", tokenizer)
    assert _learned_text(tokenizer, example) == LEARNED


def test_records_with_tool_calls_are_read_from_a_file(tmp_path: Path, tokenizer: Any) -> None:
    path = tmp_path / "tools.jsonl"
    path.write_text(json.dumps(RECORD) + "\n", encoding="utf-8")
    kind, records = read_records(path)
    assert (kind, records) == ("chat", [RECORD])
    bad = {"messages": [{**MESSAGES[2], "tool_calls": [{"function": {"name": "f"}}]}]}
    path.write_text(json.dumps(RECORD) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2: messages\[0\]\.tool_calls\[0\]\.function"):
        read_records(path)


DROPS_CALLS = TOOLS_HEAD + "{{ message['content'] }}<|im_end|>\n" + TAIL
CALLS_OUTSIDE_THE_BLOCKS = (
    TOOLS_HEAD + "{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] }}{% endgeneration %}" + CALLS + "<|im_end|>\n"
    "{% else %}{{ message['content'] }}<|im_end|>\n{% endif %}" + TAIL
)
DROPS_TOOL_RESULTS = WITHOUT_GENERATION.replace(
    "{% for message in messages %}", "{% for message in messages if message['role'] != 'tool' %}"
)
REFUSES_TOOLS = (
    "{% for message in messages %}{% if message['role'] == 'tool' %}"
    "{{ raise_exception('tool messages are not supported') }}{% endif %}{% endfor %}"
    + WITHOUT_GENERATION
)


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        (DROPS_CALLS, "messages[2]: the tool call 'get_weather' is not in the text the model"),
        (CALLS_OUTSIDE_THE_BLOCKS, "messages[2]: the tool call 'get_weather' is not in the"),
        (DROPS_TOOL_RESULTS, "messages[3]: the tool result is not in the rendered chat"),
        (REFUSES_TOOLS, "the model's chat template cannot render this chat's tool calls"),
    ],
)
def test_a_template_that_cannot_render_tool_calls_fails_naming_the_record(
    tokenizer: Any, template: str, reason: str
) -> None:
    with pytest.raises(ValueError, match="record 2: " + reason.replace("[", r"\[")):
        tokenize_records(
            [{"messages": MESSAGES[1:2] + MESSAGES[4:]}, RECORD],
            "chat",
            _with_template(tokenizer, template),
        )


REFUSES_SYSTEM = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}{% endfor %}" + WITHOUT_GENERATION
)


def test_a_template_that_raises_on_a_chat_without_tools_names_the_record_file_and_line(
    tmp_path: Path, tokenizer: Any
) -> None:
    from ace3.runtime.data.text_tokens import tokenize_file

    path = tmp_path / "chats.jsonl"
    plain = {"messages": [MESSAGES[1], MESSAGES[4]]}
    system = {"messages": [{"role": "system", "content": "be terse"}, *plain["messages"]]}
    path.write_text(f"{json.dumps(plain)}\n\n{json.dumps(system)}\n", encoding="utf-8")
    with pytest.raises(ValueError) as raised:  # (a blank line: record 2 is on line 3)
        tokenize_file(path, _with_template(tokenizer, REFUSES_SYSTEM))
    assert str(raised.value).startswith(
        f"record 2 ({path}, line 3): the model's chat template raised TemplateError: System "
        "role not supported"
    )
