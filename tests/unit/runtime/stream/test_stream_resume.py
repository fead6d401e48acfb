"""A reader's state, saved mid-shard and mid-buffer and loaded into a fresh stream, continues
with exactly the samples an uninterrupted read gives; through torchdata's StatefulDataLoader
with two workers too."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from ace3.config import TrainingConfig
from ace3.runtime.data.stream import ShardStream, stream_collate
from ace3.runtime.job_spec import DatasetSpec
from tests.stream_shards import TOKENS_LENGTH, numbered_shards, sample_id

SIZES = [7, 3, 5, 4, 6, 2]


def make(spec: DatasetSpec, *, rank: int = 0, world: int = 1, cycle: bool = False, **fields: Any):
    assert spec.stream is not None
    settings: dict[str, Any] = {"seed": 11, "shuffle_buffer": 5, "sequence_length": TOKENS_LENGTH}
    return ShardStream(
        spec,
        split="train",
        files=[s.file for s in spec.stream.shards],
        config=TrainingConfig(**{**settings, **fields}),
        rank=rank,
        world_size=world,
        cycle=cycle,
    )


def resumed(spec: DatasetSpec, cut: int, total: int, **options: Any) -> list[int]:
    """``cut`` samples, the state through JSON into a fresh stream, then the rest."""
    first = make(spec, **options)
    samples = iter(first)
    head = [sample_id(s) for s in itertools.islice(samples, cut)]
    state = json.loads(json.dumps(first.state_dict()))
    second = make(spec, **options)
    second.load_state_dict(state)
    return head + [sample_id(s) for s in itertools.islice(second, total - cut)]


@pytest.mark.parametrize("format", ["parquet", "jsonl", "tokens", "webdataset"])
def test_a_state_saved_mid_shard_resumes_exactly(tmp_path: Path, format: str) -> None:
    spec = numbered_shards(tmp_path / "shards", format, SIZES)
    options: dict[str, Any] = {"rank": 1, "world": 2}
    whole = [sample_id(s) for s in make(spec, **options)]
    assert len(whole) >= 12
    for cut in (1, 4, 9, len(whole) - 2, len(whole)):
        assert resumed(spec, cut, len(whole), **options) == whole, cut


def test_a_cycling_stream_resumes_across_its_epochs(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "jsonl", SIZES)
    whole = [sample_id(s) for s in itertools.islice(make(spec, cycle=True), 70)]
    for cut in (26, 27, 28, 60):
        assert resumed(spec, cut, 70, cycle=True) == whole, cut


def test_a_finished_epoch_state_lets_the_next_epoch_start(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "parquet", SIZES)
    first = make(spec)
    epoch0 = [sample_id(s) for s in first]
    state = first.state_dict()
    assert state["finished"] and state["epoch"] == 0
    again = make(spec)
    again.load_state_dict(state)
    assert list(again) == []  # epoch 0 is done
    later = make(spec)
    later.load_state_dict(state)
    later.set_epoch(1)
    epoch1 = [sample_id(s) for s in later]
    assert sorted(epoch1) == sorted(epoch0) and epoch1 != epoch0


def test_a_state_from_another_reader_count_is_refused(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "parquet", SIZES)
    first = make(spec, rank=0, world=2)
    next(iter(first))
    other = make(spec, rank=0, world=3)
    other.load_state_dict(first.state_dict())
    with pytest.raises(ValueError, match="reader 0 of 2, and this is reader 0 of 3"):
        next(iter(other))


def loader(spec: DatasetSpec, epoch: int = 0) -> StatefulDataLoader:
    dataset = make(spec, num_workers=2, epochs=2)
    dataset.set_epoch(epoch)
    return StatefulDataLoader(dataset, batch_size=3, num_workers=2, collate_fn=stream_collate)


def test_stateful_dataloader_with_two_workers_resumes_mid_epoch(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "parquet", [8, 5, 7, 6, 4, 9])
    whole = [batch[1].tolist() for batch in loader(spec, epoch=1)]
    expected = make(spec, num_workers=2, epochs=2).batches_per_epoch(3)
    assert len(whole) == expected
    assert {i for batch in whole for i in batch} == set(range(39))
    for cut in (1, 4, len(whole) - 1):
        first = loader(spec, epoch=1)
        batches = iter(first)
        head = [next(batches)[1].tolist() for _ in range(cut)]
        state = first.state_dict()
        del batches
        second = loader(spec, epoch=1)
        second.load_state_dict(state)
        assert head + [batch[1].tolist() for batch in second] == whole, cut


def test_a_buffer_spanning_many_shards_is_read_back_asking_for_few_at_once(
    tmp_path: Path,
) -> None:
    """A restored shuffle buffer holding samples of more shards than one request may name
    (the worker fetches only a request's first 1 + REQUEST_LOOKAHEAD names) asks for them one
    at a time, and still resumes exactly."""
    from ace3.config.shards import REQUEST_LOOKAHEAD
    from ace3.runtime.data.stream.waiting import RequestFile

    spec = numbered_shards(tmp_path / "shards", "jsonl", [2] * 12)
    options: dict[str, Any] = {"shuffle_buffer": 20}
    whole = [sample_id(s) for s in make(spec, **options)]
    written: list[list[str]] = []
    original = RequestFile.write

    def recording(self: RequestFile, need: list[str]) -> None:
        written.append(list(need))
        original(self, need)

    RequestFile.write = recording  # type: ignore[method-assign]  # (recording the requests)
    try:
        assert resumed(spec, 3, len(whole), **options) == whole
    finally:
        RequestFile.write = original  # type: ignore[method-assign]
    assert max(len(need) for need in written) <= 1 + REQUEST_LOOKAHEAD
