"""OpenAI's per-message ``weight`` in chat records, token by token: an assistant turn of weight 0
is rendered but not learned, with and without ``{% generation %}`` blocks; a null or empty
``tool_calls`` is as if absent, even for a template that tests ``'tool_calls' in message``.

A tiny byte-level BPE tokenizer is trained here on local text (no download).
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
)

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

HEAD = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
TAIL = "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
WITHOUT_GENERATION = HEAD + "{{ message['content'] }}<|im_end|>\n" + TAIL
WITH_GENERATION = (
    HEAD + "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] }}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] }}<|im_end|>\n{% endif %}" + TAIL
)
# Like Llama 3.1's: a message holding the key 'tool_calls' is one with calls.
KEY_TESTING = (
    HEAD + "{% if 'tool_calls' in message %}{% for call in message['tool_calls'] %}"
    "{{ call['function']['name'] }}{% endfor %}{% else %}{{ message['content'] }}{% endif %}"
    "<|im_end|>\n" + TAIL
)
CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "you are terse"},
    {"role": "user", "content": "what is the capital of france"},
    {"role": "assistant", "content": "paris", "weight": 0},
    {"role": "user", "content": "and of italy"},
    {"role": "assistant", "content": "rome is the capital", "weight": 1},
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
    bpe.train_from_iterator([json.dumps(message) for message in CHAT] * 10, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<eos>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )


def _tokenized(tokenizer: Any, template: str, messages: list[dict[str, Any]]) -> TokenizedExample:
    tokenizer.chat_template = template
    return tokenize_record({"messages": messages}, "chat", tokenizer)


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
def test_an_assistant_turn_of_weight_0_is_rendered_but_not_learned(
    tokenizer: Any, template: str
) -> None:
    example = _tokenized(tokenizer, template, CHAT)
    assert _learned_text(tokenizer, example) == ["rome is the capital<|im_end|>"]
    # The unlearned turn is still in the context, token for token as without weights.
    unweighted = [{k: v for k, v in m.items() if k != "weight"} for m in CHAT]
    assert example.input_ids == _tokenized(tokenizer, template, unweighted).input_ids
    # Weight 0 on the last turn instead: only the first is learned.
    flipped = [*CHAT[:2], {**CHAT[2], "weight": 1}, CHAT[3], {**CHAT[4], "weight": 0}]
    assert _learned_text(tokenizer, _tokenized(tokenizer, template, flipped)) == ["paris<|im_end|>"]


def test_both_templates_give_the_same_labels_with_weights(tokenizer: Any) -> None:
    by_blocks = _tokenized(tokenizer, WITH_GENERATION, CHAT)
    by_difference = _tokenized(tokenizer, WITHOUT_GENERATION, CHAT)
    assert by_blocks == by_difference
    opening = CHAT[2:]  # the chat opens with the unlearned assistant turn
    assert _tokenized(tokenizer, WITH_GENERATION, opening) == _tokenized(
        tokenizer, WITHOUT_GENERATION, opening
    )
    assert _learned_text(tokenizer, _tokenized(tokenizer, WITH_GENERATION, opening)) == [
        "rome is the capital<|im_end|>"
    ]


@pytest.mark.parametrize("calls", [None, []])
def test_a_null_or_empty_tool_calls_is_as_if_absent(tokenizer: Any, calls: object) -> None:
    messages = [CHAT[1], {"role": "assistant", "content": "paris", "tool_calls": calls}]
    example = _tokenized(tokenizer, KEY_TESTING, messages)
    assert _learned_text(tokenizer, example) == ["paris<|im_end|>"]


def test_a_file_whose_chat_learns_nothing_for_its_weights_is_refused_naming_the_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chats.jsonl"
    unlearned = [*CHAT[:4], {**CHAT[4], "weight": 0}]
    lines = [{"messages": CHAT}, {"messages": unlearned}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: every assistant turn has weight 0"):
        read_records(path)
    lines[1] = {"messages": [*CHAT[:4], {**CHAT[4], "weight": 0.5}]}
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 2: messages\[4\]\.weight must be 0"):
        read_records(path)
