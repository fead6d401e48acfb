"""A stream's readers: each sample once per epoch (wrapped to an equal count), deterministic
from the seed, epoch and reader, mixed by the shuffle buffer; validation reads once, in order;
a cycling stream goes on into the next epoch."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from ace3.config import TrainingConfig
from ace3.runtime.data.stream import ShardStream, stream_collate
from ace3.runtime.data.stream.buffer import ShuffleBuffer
from ace3.runtime.job_spec import DatasetSpec
from tests.stream_shards import TOKENS_LENGTH, numbered_shards, sample_id

SIZES = [7, 3, 5, 4, 6, 2]  # 27 samples


def config(**fields: Any) -> TrainingConfig:
    base: dict[str, Any] = {"seed": 5, "shuffle_buffer": 4, "sequence_length": TOKENS_LENGTH}
    return TrainingConfig(**{**base, **fields})


def stream(
    spec: DatasetSpec, rank: int = 0, world: int = 1, cycle: bool = False, **fields: Any
) -> ShardStream:
    assert spec.stream is not None
    files = [s.file for s in spec.stream.shards]
    return ShardStream(
        spec,
        split=fields.pop("split", "train"),
        files=files,
        config=config(**fields),
        rank=rank,
        world_size=world,
        cycle=cycle,
    )


def ids(dataset: ShardStream, limit: int | None = None) -> list[int]:
    return [sample_id(s) for s in itertools.islice(dataset, limit)]


def test_the_buffer_gives_each_sample_once_in_an_order_fixed_by_its_generator() -> None:
    def run(seed: int) -> list[int]:
        buffer = ShuffleBuffer(5, np.random.default_rng([seed]))
        out = [item for i in range(20) if (item := buffer.push((0, i), i)) is not None]
        while (item := buffer.pop()) is not None:
            out.append(item)
        return [sample for _, sample in out]

    assert sorted(run(1)) == list(range(20))
    assert run(1) == run(1)
    assert run(1) != run(2)
    assert run(1) != list(range(20))
    passthrough = ShuffleBuffer(5, None)
    assert passthrough.push((0, 3), "x") == ((0, 3), "x") and passthrough.pop() is None


@pytest.mark.parametrize("format", ["parquet", "jsonl", "tokens", "webdataset"])
def test_two_ranks_read_every_sample_in_an_epoch(tmp_path: Path, format: str) -> None:
    spec = numbered_shards(tmp_path / "shards", format, SIZES)
    ranks = [stream(spec, rank, 2, epochs=2) for rank in range(2)]
    read = [ids(r) for r in ranks]
    assert set(read[0]) | set(read[1]) == set(range(sum(SIZES)))
    if format in ("parquet", "tokens"):  # counts known: both ranks wrap to the same length
        assert len(read[0]) == len(read[1]) == ranks[0].wrap_to
    else:  # unknown counts: a disjoint split, one pass each
        assert not set(read[0]) & set(read[1])
        assert ranks[0].batches_per_epoch(4) is None


def test_a_shorter_share_wraps_so_every_rank_runs_the_same_batches(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "parquet", [10, 3, 2])
    ranks = [stream(spec, rank, 2, epochs=3) for rank in range(2)]
    assert ranks[0].samples_per_reader(0) in ([10, 5], [5, 10])
    assert ranks[0].wrap_to == 10
    assert ranks[0].batches_per_epoch(4) == ranks[1].batches_per_epoch(4) == 3
    for epoch in range(3):
        batches = []
        for dataset in ranks:
            dataset.set_epoch(epoch)
            batches.append(list(DataLoader(dataset, batch_size=4, collate_fn=stream_collate)))
        assert len(batches[0]) == len(batches[1]) == 3
        seen = [int(i) for rank in batches for batch in rank for i in batch[1]]
        assert set(seen) == set(range(15))
        assert len(seen) == 20  # the five-sample share is read twice


def test_the_same_seed_epoch_and_reader_give_the_same_samples(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "parquet", SIZES)
    first = stream(spec, 1, 2)
    assert ids(first) == ids(stream(spec, 1, 2))
    assert ids(first) != ids(stream(spec, 1, 2, seed=6))
    later = stream(spec, 1, 2)
    later.set_epoch(1)
    assert ids(later) != ids(first)
    unshuffled = ids(stream(spec, 0, 1, shuffle=False))
    assert unshuffled == list(range(27))  # one reader, manifest order, no buffer
    assert ids(stream(spec, 0, 1)) != unshuffled  # shard order and buffer mix it


def test_validation_reads_each_share_once_in_manifest_order(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "parquet", [10, 3, 2])
    ranks = [stream(spec, rank, 2, split="validation", cycle=True) for rank in range(2)]
    read = [ids(r) for r in ranks]
    assert sorted(read[0] + read[1]) == list(range(15))
    assert read[0] == list(range(10)) and read[1] == list(range(10, 15))
    assert ranks[0].batches_per_epoch(4) is None
    four = [ids(stream(spec, rank, 4, split="validation")) for rank in range(4)]
    assert sorted(itertools.chain(*four)) == list(range(15))  # no sample twice
    assert four[3] == []  # three shards: the fourth reader reads none


def test_a_cycling_stream_goes_on_into_its_next_epoch(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "jsonl", SIZES)
    endless = stream(spec, 0, 1, cycle=True)
    read = ids(endless, 3 * 27 + 5)
    assert all(Counter(read[e * 27 : (e + 1) * 27]) == Counter(range(27)) for e in range(3))
    assert read[:27] != read[27:54]  # reshuffled
    assert endless.state_dict()["epoch"] == 3
    assert endless.batches_per_epoch(4) is None


def test_more_readers_than_shards_still_feed_every_rank(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "tokens", [4, 2])
    ranks = [stream(spec, rank, 3, epochs=1) for rank in range(3)]
    counts = [len(ids(r)) for r in ranks]
    assert counts == [4, 4, 4]


def test_collate_stacks_tuples_and_dicts(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "tokens", [5])
    batch = next(iter(DataLoader(stream(spec), batch_size=3, collate_fn=stream_collate)))
    assert set(batch) == {"input_ids", "labels"} and batch["input_ids"].shape == (3, 2)
    spec = numbered_shards(tmp_path / "p", "parquet", [5])
    inputs, targets = next(iter(DataLoader(stream(spec), batch_size=3, collate_fn=stream_collate)))
    assert inputs.shape == (3, 2) and targets.shape == (3,)
