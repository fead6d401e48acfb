"""Text records streamed from jsonl shards (runtime/data/stream/text.py): each record tokenized,
masked, truncated and packed as a .jsonl file's are; a state saved mid-pack resumes with
exactly the items an uninterrupted read gives (also through a DataLoader worker); a share
that keeps no example is an error; the counts reach the run's summary; and a .jsonl file
tokenized once per node (runtime/data/text_tokens.py) gives the other ranks the same examples,
or the leader's error, and is deleted once used."""

from __future__ import annotations

import functools
import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ace3.config import TrainingConfig
from ace3.runtime.data import text_tokens
from ace3.runtime.data.stream import formats
from ace3.runtime.data.stream.formats import ShardFormat
from ace3.runtime.data.stream.text import TextSettings, TextShardStream, stream_text_counts
from ace3.runtime.data.text_datasets import load_tokenizer
from ace3.runtime.data.text_records import (
    TokenizedTextDataset,
    padding_tokens,
    read_records,
    tokenize_record,
    tokenize_records,
)
from ace3.runtime.data.text_streams import stream_records_kind
from ace3.runtime.data.text_tokens import Once, TokenArrays, tokenize_file, tokenize_once
from ace3.runtime.job_spec import DatasetSpec
from ace3.runtime.loop.text_counts import TextCounts
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
            named: bool = True, **fields: Any) -> TextShardStream:  # fmt: skip
    assert spec.stream is not None
    tokenizer = load_tokenizer(model)
    text = TextSettings("prompt_completion", named, tokenizer, LENGTH, packing, 0)
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
    once = Once(tmp_path / "scratch", True, lambda: waits.append(1), poll_seconds=0.01)
    follower = Once(once.scratch, False, once.wait, poll_seconds=0.01)
    (once.scratch / "train").mkdir(parents=True)
    (once.scratch / "train" / "meta.json").write_text('{"kind": "text", "count": 0}')  # stale
    once.start()  # the leader removes an earlier launch's files; then every rank meets
    assert waits == [1] and not (once.scratch / "train").exists()
    with ThreadPoolExecutor(1) as pool:  # the follower waits for the file, not a collective
        other_future = pool.submit(tokenize_once, data, tokenizer, None, follower.at("train"))
        leader = tokenize_once(data, tokenizer, None, once.at("train"))
        other = other_future.result(timeout=60)
    assert waits == [1] and isinstance(other[1], TokenArrays)  # (no barrier while tokenizing)
    assert leader == tokenize_file(data, tokenizer)
    assert other[0] == leader[0] and list(other[1]) == leader[1]
    assert list(other[1][28:]) == leader[1][28:] and other[1][-1] == leader[1][-1]
    once.finish()  # once every rank has built its datasets, the scratch files are deleted
    assert waits == [1, 1] and not once.scratch.exists()
    once.start()
    data.write_text('{"prompt": "a"}\n')  # the leader's error is every rank's
    with pytest.raises(ValueError, match="line 1") as raised:
        tokenize_once(data, tokenizer, None, once)
    with pytest.raises(ValueError) as again:
        tokenize_once(data, tokenizer, None, follower)
    assert str(again.value) == str(raised.value)


def test_any_error_of_the_leader_reaches_the_other_ranks(
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(_record(i)) + "\n" for i in range(3)))
    tokenizer = load_tokenizer(model_dir)
    once = Once(tmp_path / "scratch", True, lambda: None, poll_seconds=0.01)
    once.start()

    def disk_full(directory: Path, examples: Any) -> None:
        (directory / "ids.bin").write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(text_tokens, "write_examples", disk_full)
    with pytest.raises(OSError, match="No space left"):
        tokenize_once(data, tokenizer, None, once)
    assert not (once.scratch / "ids.bin").exists()  # (its partial arrays removed)
    follower = Once(once.scratch, False, once.wait, poll_seconds=0.01)
    with pytest.raises(RuntimeError, match=r"local rank 0: OSError: .*No space left on device"):
        tokenize_once(data, tokenizer, None, follower)


def test_a_share_whose_every_record_is_left_out_is_an_error_not_a_silent_hang(
    tmp_path: Path,
    model_dir: Path,  # noqa: F811
) -> None:
    directory = tmp_path / "long"
    directory.mkdir()
    record = {"prompt": " ".join(WORDS[:14]), "completion": "x y"}  # no completion within 12
    for index in range(2):
        write_jsonl(directory / f"{index:06d}.jsonl", [record, record])
    spec = stream_dataset(directory, "jsonl").model_copy(update={"records": "prompt_completion"})
    for split in ("train", "validation"):
        stream = _stream(spec, model_dir, packing=False, split=split)
        with pytest.raises(ValueError, match=r"shards \(0000.*sequence_length=12") as raised:
            next(iter(stream))
        assert "000000.jsonl" in str(raised.value) and "000001.jsonl" in str(raised.value)


def test_a_text_records_line_is_bounded(
    shards: DatasetSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shards.stream is not None
    monkeypatch.setattr(formats, "MAX_RECORD_LINE_CHARS", 60)
    path = Path(shards.path) / shards.stream.shards[0].file
    path.write_text('{"text": "a"}\n' + json.dumps({"text": "b" * 80}) + "\n")
    samples = ShardFormat(shards.stream, None, records=True).samples(path)
    assert next(samples)[1:] == (1, {"text": "a"})
    with pytest.raises(ValueError, match=r"000000\.jsonl, line 2: longer than 60 characters"):
        next(samples)


def _loader(stream: TextShardStream) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader  # type: ignore[import-untyped]  # torchdata ships no types

    return StatefulDataLoader(stream, batch_size=2, num_workers=1, collate_fn=stream.collate_fn)


def _batches(batches: Any, count: int) -> list[dict[str, list[list[int]]]]:
    return [{k: v.tolist() for k, v in b.items()} for b in itertools.islice(batches, count)]


@pytest.mark.filterwarnings("ignore:.*set_vital.*:UserWarning")  # (torchdata 0.11's own call)
def test_a_resumed_loader_worker_gives_the_batches_of_an_undisturbed_one_and_counts_them(
    shards: DatasetSpec,
    model_dir: Path,  # noqa: F811
) -> None:
    unnamed = shards.model_copy(update={"records": None})  # the kind read again on resume

    def make() -> TextShardStream:
        kind = stream_records_kind(unnamed, 0)
        assert kind == "prompt_completion"
        return _stream(unnamed, model_dir, packing=True, split="train", num_workers=1, named=False)

    whole_loader = _loader(make())
    whole_batches = iter(whole_loader)
    whole = _batches(whole_batches, 14)  # (past the first pass: the stream cycles)
    first = _loader(make())
    head = _batches(iter(first), 5)  # mid-pack: an open pack is in the worker's state
    state = first.state_dict()
    assert stream_text_counts(state)["item_tokens"] < stream_text_counts(state)["tokens"]  # open
    second = _loader(make())
    second.load_state_dict(state)
    assert head + _batches(iter(second), 9) == whole
    # The summary's counts (TextCounts): what the worker read, from the loader's state.
    position = whole_loader.state_dict()
    counts = stream_text_counts(position)
    assert counts["items"] == 28 and counts["examples"] and counts["truncated"]
    assert counts["dropped"]
    tokens = sum(sum(map(len, b["input_ids"])) - _padding(b) for b in whole)
    assert counts["item_tokens"] == tokens
    loop = SimpleNamespace(
        ctx=SimpleNamespace(world_size=1), train_data=SimpleNamespace(position=lambda: position)
    )
    metrics = TextCounts(make(), 1).finish(loop)  # (a stand-in loop)
    assert metrics["text_truncated"] == counts["truncated"]
    assert metrics["text_padding_share"] == pytest.approx(1 - tokens / (28 * LENGTH))


def _padding(batch: dict[str, list[list[int]]]) -> int:
    return padding_tokens({k: torch.tensor(v) for k, v in batch.items()})


def test_a_files_counts_are_in_the_summary_too(model_dir: Path) -> None:  # noqa: F811
    examples = [tokenize_record(_record(i), "prompt_completion", load_tokenizer(model_dir))
                for i in range(10)]  # fmt: skip
    dataset = TokenizedTextDataset(examples, LENGTH, True, 0)
    metrics = TextCounts(dataset, 1).finish(None)  # type: ignore[arg-type]  # (unused)
    report = dataset.report
    assert metrics == {
        "text_examples": report.examples, "text_truncated": report.truncated,
        "text_dropped": report.dropped, "text_tokens": report.tokens,
        "text_padding_share": report.padding_share,
    }  # fmt: skip
