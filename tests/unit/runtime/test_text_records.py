"""Text records: reading and checking them, loss masking token by token, truncation and packing.

A tiny byte-level BPE tokenizer is trained here on local text (no download), with ChatML
templates set by hand: one with ``{% generation %}`` blocks and one without.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from ace3.runtime.data.text_records import (
    IGNORE_INDEX,
    TokenizedExample,
    TokenizedTextDataset,
    collate_text,
    detect_record_kind,
    padding_tokens,
    read_records,
    tokenize_record,
    tokenize_records,
)

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

TEMPLATE_HEAD = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
CHATML_WITHOUT_GENERATION = (
    TEMPLATE_HEAD + "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_WITH_GENERATION = (
    TEMPLATE_HEAD + "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] }}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT = [
    {"role": "system", "content": "you are terse"},
    {"role": "user", "content": "what is the capital of france"},
    {"role": "assistant", "content": "paris"},
    {"role": "user", "content": "and of italy"},
    {"role": "assistant", "content": "rome is the capital"},
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
    corpus = [json.dumps(message) for message in CHAT] + ["the capital of spain is madrid"]
    bpe.train_from_iterator(corpus * 10, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<eos>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )


def _with_template(tokenizer: Any, template: str | None) -> Any:
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


@pytest.mark.parametrize("template", [CHATML_WITH_GENERATION, CHATML_WITHOUT_GENERATION])
def test_a_chat_learns_only_the_assistant_replies_and_their_end_of_turn(
    tokenizer: Any, template: str
) -> None:
    example = tokenize_record({"messages": CHAT}, "chat", _with_template(tokenizer, template))
    assert _learned_text(tokenizer, example) == [
        "paris<|im_end|>",
        "rome is the capital<|im_end|>",
    ]
    assert example.input_ids == tokenizer.apply_chat_template(CHAT, return_dict=True)["input_ids"]


def test_a_chat_opening_with_the_assistant_learns_none_of_the_templates_prefix(
    tokenizer: Any,
) -> None:
    # A template that adds a default system prompt: it comes before the first assistant turn.
    default_system = (
        "{% if not messages or messages[0]['role'] != 'system' %}<|im_start|>system\n"
        "you are terse<|im_end|>\n{% endif %}" + CHATML_WITHOUT_GENERATION
    )
    chat = [{"role": "assistant", "content": "paris"}, *CHAT[3:]]
    example = tokenize_record({"messages": chat}, "chat", _with_template(tokenizer, default_system))
    assert _learned_text(tokenizer, example) == [
        "paris<|im_end|>",
        "rome is the capital<|im_end|>",
    ]


def test_both_templates_give_the_same_labels(tokenizer: Any) -> None:
    with_blocks = tokenize_record(
        {"messages": CHAT}, "chat", _with_template(tokenizer, CHATML_WITH_GENERATION)
    )
    by_difference = tokenize_record(
        {"messages": CHAT}, "chat", _with_template(tokenizer, CHATML_WITHOUT_GENERATION)
    )
    assert with_blocks == by_difference


def test_an_all_zero_generation_mask_falls_back_to_rendering_each_turn(tokenizer: Any) -> None:
    # Generation blocks that mark nothing give an all-zero mask: it must not mean "learn nothing".
    empty_blocks = "{% if false %}{% generation %}{% endgeneration %}{% endif %}"
    template = empty_blocks + CHATML_WITHOUT_GENERATION
    example = tokenize_record({"messages": CHAT}, "chat", _with_template(tokenizer, template))
    assert _learned_text(tokenizer, example) == ["paris<|im_end|>", "rome is the capital<|im_end|>"]


def test_chat_records_need_a_chat_template(tokenizer: Any) -> None:
    no_template = _with_template(tokenizer, None)
    with pytest.raises(ValueError, match="the model's tokenizer has no chat template; "):
        tokenize_record({"messages": CHAT}, "chat", no_template)
    with pytest.raises(ValueError, match="no chat template"):
        tokenize_records([{"messages": CHAT}], "chat", no_template)


def test_prompt_tokens_are_ignored_and_the_completion_with_eos_learned(tokenizer: Any) -> None:
    record = {"prompt": "the capital of spain is", "completion": " madrid"}
    example = tokenize_record(record, "prompt_completion", tokenizer)
    assert _learned_text(tokenizer, example) == [" madrid<eos>"]
    assert tokenizer.decode(example.input_ids) == "the capital of spain is madrid<eos>"


def test_a_token_merging_prompt_and_completion_is_learned(tokenizer: Any) -> None:
    # "capi" + "tal": the concatenation has the merged "capital" token, which the prompt's own
    # tokenization does not: the rule learns it (the model writes its "tal").
    record = {"prompt": "the capi", "completion": "tal"}
    example = tokenize_record(record, "prompt_completion", tokenizer)
    learned = _learned_text(tokenizer, example)
    assert learned[-1].endswith("tal<eos>")
    assert "the" not in "".join(learned)


def test_text_learns_every_token_and_eos(tokenizer: Any) -> None:
    example = tokenize_record({"text": "the capital of spain"}, "text", tokenizer)
    assert example.labels == example.input_ids
    assert tokenizer.decode(example.input_ids) == "the capital of spain<eos>"


def test_an_example_that_learns_nothing_is_refused(tokenizer: Any) -> None:
    no_eos = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    with pytest.raises(ValueError, match="completion adds no token to learn"):
        tokenize_record({"prompt": "the capital", "completion": ""}, "prompt_completion", no_eos)
    with pytest.raises(ValueError, match="record 2: the text tokenizes to 1 token"):
        tokenize_records([{"text": "the capital"}, {"text": "the"}], "text", no_eos)


def test_record_kinds_are_detected_and_mixed_kinds_refused() -> None:
    assert detect_record_kind([{"messages": CHAT}]) == "chat"
    assert detect_record_kind([{"prompt": "a", "completion": "b"}]) == "prompt_completion"
    assert detect_record_kind([{"text": "a"}, {"text": "b"}]) == "text"
    with pytest.raises(ValueError, match="line 2: a prompt_completion record among text"):
        detect_record_kind([{"text": "a"}, {"prompt": "a", "completion": "b"}])
    with pytest.raises(ValueError, match=r"line 1: a record with \['input'\] is none of"):
        detect_record_kind([{"input": "a"}])
    with pytest.raises(ValueError, match="no records"):
        detect_record_kind([])


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_read_records_skips_blank_lines_and_names_the_file_and_line(tmp_path: Path) -> None:
    good = _jsonl(tmp_path / "good.jsonl", [json.dumps({"messages": CHAT}), "", "  "])
    assert read_records(good) == ("chat", [{"messages": CHAT}])
    bad_role = [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]
    cases = {
        "messages[0]: role 'robot' is not one of": {"messages": bad_role},
        "a chat with no assistant turn": {"messages": [{"role": "user", "content": "x"}]},
        "messages[0]: 'content' must be a string": {
            "messages": [{"role": "assistant", "content": ["x"]}]
        },
    }
    for expected, record in cases.items():
        path = _jsonl(
            tmp_path / "bad.jsonl", [json.dumps({"messages": CHAT}), "", json.dumps(record)]
        )
        with pytest.raises(ValueError, match=re.escape(f"bad.jsonl, line 3: {expected}")):
            read_records(path)
    path = _jsonl(tmp_path / "pc.jsonl", [json.dumps({"prompt": "a", "completion": 3})])
    with pytest.raises(
        ValueError, match=re.escape('pc.jsonl, line 1: "completion" must be a string')
    ):
        read_records(path)
    mixed = _jsonl(
        tmp_path / "mixed.jsonl", ['{"text": "a"}', "", '{"prompt": "a", "completion": "b"}']
    )
    with pytest.raises(
        ValueError, match=re.escape("mixed.jsonl, line 3: a prompt_completion record among")
    ):
        read_records(mixed)
    with pytest.raises(ValueError, match=re.escape("mixed.jsonl, line 3: a record with")):
        read_records(mixed, kind="text")
    broken = _jsonl(tmp_path / "broken.jsonl", ['{"text": "a"}', "{"])
    with pytest.raises(ValueError, match=re.escape("broken.jsonl, line 2: not valid JSON")):
        read_records(broken)


def _example(length: int, learned_from: int = 0, offset: int = 10) -> TokenizedExample:
    input_ids = list(range(offset, offset + length))
    labels = [IGNORE_INDEX] * learned_from + input_ids[learned_from:]
    return TokenizedExample(input_ids=input_ids, labels=labels)


def test_truncation_is_counted_and_examples_left_with_nothing_to_learn_dropped() -> None:
    examples = [_example(5), _example(12), _example(20, learned_from=10)]
    dataset = TokenizedTextDataset(examples, sequence_length=8, packing=False, pad_token_id=0)
    assert [len(item["input_ids"]) for item in dataset] == [5, 8]
    assert "position_ids" not in dataset[0]
    report = dataset.report
    assert (report.examples, report.truncated, report.dropped, report.tokens) == (2, 2, 1, 13)
    assert report.padding_share == pytest.approx(1 - 13 / 16)
    with pytest.raises(ValueError, match="no example learns anything"):
        TokenizedTextDataset([examples[2]], sequence_length=8, packing=False, pad_token_id=0)


def test_packing_keeps_whole_examples_restarts_positions_and_ignores_boundaries() -> None:
    examples = [_example(3, offset=10), _example(4, offset=20), _example(6, offset=30), _example(9)]
    dataset = TokenizedTextDataset(examples, sequence_length=8, packing=True, pad_token_id=0)
    assert [len(item["input_ids"]) for item in dataset] == [7, 6, 8]
    first = dataset[0]
    assert first["input_ids"].tolist() == [10, 11, 12, 20, 21, 22, 23]
    assert first["position_ids"].tolist() == [0, 1, 2, 0, 1, 2, 3]
    assert first["labels"].tolist() == [IGNORE_INDEX, 11, 12, IGNORE_INDEX, 21, 22, 23]
    assert (dataset.report.truncated, dataset.report.tokens) == (1, 21)
    assert dataset.report.padding_share == pytest.approx(1 - 21 / 24)


def test_collate_pads_right_and_counts_padding() -> None:
    plain = TokenizedTextDataset([_example(3), _example(5)], 8, packing=False, pad_token_id=0)
    batch = collate_text([plain[0], plain[1]], pad_token_id=0)
    assert batch["input_ids"][0].tolist() == [10, 11, 12, 0, 0]
    assert batch["labels"][0].tolist() == [10, 11, 12, IGNORE_INDEX, IGNORE_INDEX]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert padding_tokens(batch) == 2
    packed = TokenizedTextDataset([_example(3), _example(4), _example(2)], 8, True, 0)
    batch = collate_text([packed[0], packed[1]], pad_token_id=0)
    assert "attention_mask" not in batch  # a 2-D mask would stop transformers unpacking
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3], [0, 1, 0, 0, 0, 0, 0]]
    assert batch["labels"][1].tolist() == [IGNORE_INDEX, 11] + [IGNORE_INDEX] * 5
    assert padding_tokens(batch) == 5


def test_a_packed_example_has_its_unpacked_loss(tokenizer: Any) -> None:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=1, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    model.config._attn_implementation = "eager"
    records = [
        {"prompt": "the capital of", "completion": " spain is madrid"},
        {"prompt": "what is", "completion": " the capital of france"},
        {"prompt": "and of", "completion": " italy"},
    ]
    examples = tokenize_records(records, "prompt_completion", tokenizer)
    pad = tokenizer.pad_token_id
    unpacked = TokenizedTextDataset(examples, 64, packing=False, pad_token_id=pad)
    packed = TokenizedTextDataset(examples, 64, packing=True, pad_token_id=pad)
    assert len(packed) == 1
    batch = collate_text([packed[0]], pad_token_id=pad)
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits[0]
    start = 0
    for item in unpacked:
        alone = model(**collate_text([item], pad_token_id=pad), use_cache=False).loss
        end = start + len(item["input_ids"])
        labels = batch["labels"][0, start + 1 : end]
        in_pack = torch.nn.functional.cross_entropy(
            logits[start : end - 1], labels, ignore_index=IGNORE_INDEX
        )
        torch.testing.assert_close(in_pack, alone)
        start = end
    # With a 2-D attention mask the pack is one sequence: the later examples see the earlier.
    with_mask = model(**batch, attention_mask=torch.ones_like(batch["input_ids"]), use_cache=False)
    assert not torch.allclose(with_mask.logits[0], logits)
