"""Text records streamed from jsonl shards (runtime/data/stream/text.py): each record tokenized,
masked, truncated and packed as a .jsonl file's are; a state saved mid-pack resumes with
exactly the items an uninterrupted read gives; and a .jsonl file tokenized once per node
(runtime/data/text_tokens.py) gives the other ranks the same examples."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from ace3.config import TrainingConfig
from ace3.runtime.data.stream.text import TextSettings, TextShardStream
from ace3.runtime.data.text_datasets import load_tokenizer
from ace3.runtime.data.text_records import TokenizedTextDataset, read_records, tokenize_records
from ace3.runtime.data.text_streams import stream_records_kind
from ace3.runtime.data.text_tokens import Once, TokenArrays, tokenize_file, tokenize_once
from ace3.runtime.job_spec import DatasetSpec
from tests.stream_shards import stream_dataset, write_jsonl
from tests.unit.runtime.test_text_datasets import TEXT, model_dir  # noqa: F401  (a fixture)

LENGTH = 12
WORDS = TEXT.split()


def _record(i: int) -> dict[str, str]:
    # some completions run past LENGTH tokens (truncated), one in 7 with nothing left to learn
    prompt = " ".join(WORDS[: 14 if i % 7 == 3 else 1 + i % 4])
    return {"prompt": prompt, "completion": " ".join(WORDS[i % 5 : i % 5 + 1 + i % 6])}


@pytest.fixture
def shards(tmp_path: Path) -> DatasetSpec:
    directory = tmp_path / "shards"
    directory.mkdir()
    sizes, start = [5, 9, 4, 7], 0
    for index, size in enumerate(sizes):
        records: list[Any] = [_record(start + i) for i in range(size)]
        records.insert(2, "")  # a blank line: skipped, never a record
        write_jsonl(directory / f"{index:06d}.jsonl", records)
        start += size
    return stream_dataset(directory, "jsonl").model_copy(update={"records": "prompt_completion"})


def _stream(spec: DatasetSpec, model: Path, *, packing: bool, split: str = "validation",
            **fields: Any) -> TextShardStream:  # fmt: skip
    assert spec.stream is not None
    tokenizer = load_tokenizer(model)
    text = TextSettings("prompt_completion", True, tokenizer, LENGTH, packing, 0)
    config = TrainingConfig(seed=3, shuffle_buffer=4, sequence_length=LENGTH, **fields)
    return TextShardStream(
        spec, split=split, files=[s.file for s in spec.stream.shards],  # type: ignore[arg-type]  # a literal
        config=config, rank=0, world_size=1, cycle=split == "train", text=text,
    )  # fmt: skip


def _items(items: Any) -> list[tuple[tuple[int, ...], ...]]:
    return [tuple(tuple(v.tolist()) for _, v in sorted(item.items())) for item in items]


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_a_stream_tokenizes_masks_truncates_and_packs_as_a_file_does(
    shards: DatasetSpec,
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
    packing: bool,
) -> None:
    assert shards.stream is not None
    whole = tmp_path / "all.jsonl"  # the shards' records as one file, in the manifest's order
    whole.write_text("".join(
        (Path(shards.path) / s.file).read_text() for s in shards.stream.shards
    ))  # fmt: skip
    kind, records = read_records(whole, "prompt_completion")
    examples = tokenize_records(records, kind, load_tokenizer(model_dir))
    expected = TokenizedTextDataset(examples, LENGTH, packing, 0)
    assert expected.report.truncated and expected.report.dropped  # (the test covers both)
    stream = _stream(shards, model_dir, packing=packing)  # validation: one pass, in order
    got = list(stream)
    assert _items(got) == _items(expected.items)
    counts = stream.state_dict()["text"]["counts"]
    report = expected.report
    assert (counts["examples"], counts["truncated"], counts["dropped"], counts["tokens"]) == (
        report.examples, report.truncated, report.dropped, report.tokens
    )  # fmt: skip
    batch = stream.collate_fn(got[:3])
    assert ("attention_mask" in batch) != packing and batch["input_ids"].dtype == torch.long


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_a_state_saved_mid_pack_resumes_exactly(
    shards: DatasetSpec,
    model_dir: Path,  # noqa: F811
    packing: bool,
) -> None:
    make = functools.partial(_stream, shards, model_dir, packing=packing, split="train")
    total = 40  # past the first pass: the stream cycles
    whole = _items(itertools.islice(make(), total))
    for cut in (1, 5, 11, 23):
        first = make()
        head = _items(itertools.islice(iter(first), cut))
        state = json.loads(json.dumps(first.state_dict()))  # (a checkpoint keeps it)
        assert "text" in state and "cursor" in state
        second = make()
        second.load_state_dict(state)
        assert head + _items(itertools.islice(iter(second), total - cut)) == whole, cut


def test_the_kind_is_named_or_read_from_the_first_shard(shards: DatasetSpec) -> None:
    assert stream_records_kind(shards, 0) == "prompt_completion"
    unnamed = shards.model_copy(update={"records": None})
    assert stream_records_kind(unnamed, 1) == "prompt_completion"  # read from the first shard
    assert shards.stream is not None
    request = Path(shards.stream.requests) / "train-r1-w0.json"
    assert json.loads(request.read_text())["need"] == [shards.stream.shards[0].file]
    assert stream_records_kind(DatasetSpec(path="x.jsonl"), 0) is None


def test_a_file_is_tokenized_once_and_read_by_the_other_ranks_alike(
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(_record(i)) + "\n" for i in range(30)))
    tokenizer = load_tokenizer(model_dir)
    waits: list[int] = []
    once = Once(tmp_path / "scratch", True, lambda: waits.append(1))
    leader = tokenize_once(data, tokenizer, None, once)
    other = tokenize_once(data, tokenizer, None, Once(once.scratch, False, once.wait))
    assert len(waits) == 2 and isinstance(other[1], TokenArrays)
    assert leader == tokenize_file(data, tokenizer)
    assert other[0] == leader[0] and list(other[1]) == leader[1]
    assert list(other[1][28:]) == leader[1][28:] and other[1][-1] == leader[1][-1]
    data.write_text('{"prompt": "a"}\n')  # the leader's error is every rank's
    with pytest.raises(ValueError, match="line 1") as raised:
        tokenize_once(data, tokenizer, None, once)
    with pytest.raises(ValueError) as again:
        tokenize_once(data, tokenizer, None, Once(once.scratch, False, once.wait))
    assert str(again.value) == str(raised.value)
