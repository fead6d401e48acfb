"""Shards are dealt to readers disjointly and evenly, reshuffled each epoch from the seed, and
validation holds out whole shards."""

from __future__ import annotations

import pytest

from ace3.config import TrainingConfig
from ace3.runtime.data.stream import split_shards
from ace3.runtime.data.stream.assignment import ShardPlan, assign, shard_order
from ace3.runtime.job_spec import DatasetSpec, StreamSpec


def test_every_shard_goes_to_exactly_one_reader_and_loads_are_balanced() -> None:
    counts = [10, 7, 3, 12, 9, 1, 5, 8, 6, 11, 2, 4]
    plan = ShardPlan(counts, [0] * len(counts), readers=4, seed=3, shuffle=True)
    for epoch in range(5):
        shares = plan.shares(epoch)
        dealt = sorted(shard for share in shares for shard in share)
        assert dealt == list(range(len(counts)))
        loads = plan.samples_per_reader(epoch)
        assert loads is not None and sum(loads) == sum(counts)
        # largest first to the least loaded: within one shard of each other
        assert max(loads) - min(loads) <= max(counts)
        assert max(loads) <= sum(counts) / 4 + max(counts) / 2


def test_the_largest_shard_goes_first_to_the_least_loaded_reader_ties_to_the_lowest() -> None:
    assert assign([0, 1, 2, 3], [5, 5, 1, 1], readers=2) == [[0, 2], [1, 3]]
    # dealt 1, 0 (size 5, in the epoch's order), then 3, 2; each share read in the epoch's order
    assert assign([3, 2, 1, 0], [5, 5, 1, 1], readers=2) == [[3, 1], [2, 0]]
    assert assign([1, 2, 0], [10, 3, 2], readers=2) == [[0], [1, 2]]


def test_unknown_counts_balance_bytes() -> None:
    plan = ShardPlan([None, None, None], [100, 10, 10], readers=2, seed=0, shuffle=False)
    assert plan.shares(0) == [[0], [1, 2]]
    assert plan.samples_per_reader(0) is None and plan.longest(3) is None


def test_shard_order_is_reshuffled_each_epoch_from_the_seed() -> None:
    orders = [shard_order(20, seed=7, epoch=e, shuffle=True) for e in range(3)]
    assert all(sorted(order) == list(range(20)) for order in orders)
    assert orders[0] != orders[1] != orders[2]
    assert shard_order(20, seed=7, epoch=1, shuffle=True) == orders[1]
    assert shard_order(20, seed=8, epoch=1, shuffle=True) != orders[1]
    assert shard_order(20, seed=7, epoch=1, shuffle=False) == list(range(20))


def test_more_readers_than_shards_repeat_a_share_rather_than_starve() -> None:
    shares = assign([0, 1], [3, 4], readers=5)
    assert shares[:2] == [[1], [0]]  # the larger first
    assert all(shares[r] for r in range(5))


def test_longest_is_the_most_any_reader_holds_in_any_planned_epoch() -> None:
    counts = [9, 1, 5, 5, 3, 7]
    plan = ShardPlan(counts, [0] * 6, readers=3, seed=1, shuffle=True)
    expected = max(max(plan.samples_per_reader(e) or []) for e in range(4))
    assert plan.longest(4) == expected


def spec(count: int) -> DatasetSpec:
    shards = [{"file": f"{i:06d}.parquet", "size": 1, "samples": 1} for i in range(count)]
    return DatasetSpec(
        path="/d",
        stream=StreamSpec.model_validate({"format": "parquet", "shards": shards, "requests": "/r"}),
    )


def test_validation_holds_out_ten_percent_of_shards_by_default() -> None:
    train, validation = split_shards(spec(30), TrainingConfig())
    assert len(validation) == 3 and len(train) == 27
    assert sorted(train + validation) == [f"{i:06d}.parquet" for i in range(30)]
    assert train == sorted(train) and validation == sorted(validation)  # manifest order
    assert split_shards(spec(30), TrainingConfig()) == (train, validation)
    assert split_shards(spec(30), TrainingConfig(seed=1))[1] != validation


def test_validation_holds_out_at_least_one_shard_and_none_of_one() -> None:
    assert len(split_shards(spec(4), TrainingConfig())[1]) == 1
    assert split_shards(spec(1), TrainingConfig()) == (["000000.parquet"], [])
    assert split_shards(spec(5), TrainingConfig(validation_split=0))[1] == []
    assert len(split_shards(spec(10), TrainingConfig(validation_split=0.25))[1]) == 2  # round(2.5)
    assert len(split_shards(spec(10), TrainingConfig(validation_split=0.01))[1]) == 1
    assert len(split_shards(spec(2), TrainingConfig(validation_split=0.9))[0]) == 1
    with pytest.raises(ValueError, match="validation_split"):
        split_shards(spec(1), TrainingConfig(validation_split=0.5))
