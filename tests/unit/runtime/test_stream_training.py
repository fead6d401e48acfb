"""Streamed datasets in the engine, piece by piece: what ``load_datasets`` makes of a stream and
refuses, the training data source's plan and position, the position in a gathered checkpoint,
and a lockstep validation over a stream whose ranks hold different numbers of batches (two gloo
processes). The whole runs (torchrun, resume bit for bit) are in
tests/integration/runtime/test_runtime_streams.py."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from ace3.config import DynamicBatchSizeConfig, TrainingConfig
from ace3.runtime.checkpoint.format import RankStates
from ace3.runtime.checkpoint.plain import data_position
from ace3.runtime.data.datasets import load_datasets
from ace3.runtime.data.stream import ShardStream
from ace3.runtime.data.train_source import StreamTrainData, train_data_for
from ace3.runtime.loop.evaluation import evaluate
from ace3.runtime.loop.precision import resolve_precision
from ace3.runtime.loop.rng import capture_rng
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.parallel.dims import ParallelDims
from ace3.runtime.process.distributed import DistContext
from ace3.runtime.user_code import UserCode
from tests.stream_shards import numbered_shards

SIZES = [6, 6, 6, 6, 6]


def _config(**fields: Any) -> TrainingConfig:
    return TrainingConfig(**{"batch_size": 4, "seed": 3, "shuffle_buffer": 4, **fields})


def test_a_parquet_stream_trains_on_all_but_the_held_out_shard(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "parquet", SIZES)
    data = load_datasets(spec, None, _config(epochs=2), replica=(1, 2))
    train, validation = data.train, data.validation
    assert isinstance(train, ShardStream) and isinstance(validation, ShardStream)
    assert (train.rank, train.world_size, train.cycle) == (1, 2, False)
    assert len(train.files) == 4 and len(validation.files) == 1
    assert not set(train.files) & set(validation.files)
    assert data.notes == ("validation: 1 of the dataset's 5 shards held out",)
    source = train_data_for(train, _config(epochs=2), (1, 2), 2, rank=1, pin_memory=False)
    assert isinstance(source, StreamTrainData)
    # 4 shards of 6 over 2 readers: 12 samples a reader, 6 batches of 2 per rank an epoch.
    assert (source.batches_per_epoch, source.epochs, source.cycling) == (6, 2, False)
    assert source.position() is None  # nothing read yet: (epoch, batch) says it all


def test_a_stream_with_max_steps_and_no_epochs_cycles_as_one_epoch(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "parquet", SIZES)
    config = _config(max_steps=7, gradient_accumulation_steps=2, validation_split=0)
    data = load_datasets(spec, None, config)
    assert data.validation is None and data.train.cycle  # type: ignore[attr-defined]
    source = train_data_for(data.train, config, (0, 1), 4, rank=0, pin_memory=False)
    assert (source.batches_per_epoch, source.epochs, source.cycling) == (14, 1, True)
    batches = source.batches(0, 0, None, None)
    seen = [int(target) for _ in range(10) for target in next(batches)[1]]
    assert len(seen) == 40 > sum(SIZES)  # past the end of a pass: it cycled


def test_jsonl_refuses_epochs_and_needs_max_steps(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "jsonl", SIZES)
    with pytest.raises(ValueError, match=r"^epochs=2: the sample count .* is not known"):
        load_datasets(spec, None, _config(epochs=2, max_steps=5))
    with pytest.raises(ValueError, match=r"^max_steps: .* set max_steps"):
        load_datasets(spec, None, _config())
    assert load_datasets(spec, None, _config(max_steps=5)).train.cycle  # type: ignore[attr-defined]


def test_batch_size_growth_on_a_stream_is_refused_naming_the_field(tmp_path: Path) -> None:
    spec = numbered_shards(tmp_path / "shards", "parquet", SIZES)
    growth = DynamicBatchSizeConfig(initial_batch_size=4, target_batch_size=8, min_batch_size=4)
    config = _config(epochs=1, dynamic_batch_size=growth)
    train = load_datasets(spec, None, config).train
    with pytest.raises(ValueError, match=r"^dynamic_batch_size: batch-size growth is not"):
        train_data_for(train, config, (0, 1), 4, rank=0, pin_memory=False)


def test_a_position_resumes_only_with_the_replicas_and_settings_that_saved_it(
    tmp_path: Path,
) -> None:
    spec = numbered_shards(tmp_path / "shards", "parquet", SIZES)
    config = _config(epochs=1, validation_split=0)
    source = train_data_for(load_datasets(spec, None, config).train, config, (0, 1), 4, 0, False)
    batches = source.batches(0, 0, None, None)
    taken = [next(batches) for _ in range(2)]
    position = source.position()
    assert (position["epoch"], position["batch_in_epoch"], position["replicas"]) == (0, 2, 1)
    rest = [batch[1].tolist() for batch in batches]
    again = train_data_for(load_datasets(spec, None, config).train, config, (0, 1), 4, 0, False)
    assert [b[1].tolist() for b in again.batches(0, 2, position, None)] == rest
    assert taken and rest
    with pytest.raises(ValueError, match="saved with num_workers=0 and this run has num_workers=2"):
        other = _config(epochs=1, validation_split=0, num_workers=2)
        moved = train_data_for(load_datasets(spec, None, other).train, other, (0, 1), 4, 0, False)
        moved.batches(0, 2, position, None)
    with pytest.raises(ValueError, match="needs its data position, and the checkpoint holds none"):
        again.batches(0, 2, None, None)

    parts = SimpleNamespace(train_data=SimpleNamespace(replica=(1, 3)))
    with pytest.raises(ValueError, match=r"position of 2 data-parallel replica.* this run has 3"):
        data_position({"data_per_replica": [position, position]}, parts)  # type: ignore[arg-type]
    assert data_position({"rng_per_rank": []}, parts) is None  # type: ignore[arg-type]


def test_the_gathered_format_keeps_and_restores_the_data_position() -> None:
    from ace3.runtime.checkpoint.gathered import GatheredFormat  # (after the strategies)

    ctx = DistContext(0, 0, 1, "gloo", torch.device("cpu"))
    config = TrainingConfig()
    model = nn.Linear(3, 2)
    form = GatheredFormat(ParallelDims(dp=1, pp=1, tp=1, rank=0), ctx)
    form.split_from(model, None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TrainState(step=4, epoch=1, batch_in_epoch=2)
    scaler = SimpleNamespace(is_enabled=lambda: False)
    parts = SimpleNamespace(
        config=config, model=model, optimizer=optimizer, scheduler=None, scaler=scaler,
        state=state, train_data=SimpleNamespace(replica=(0, 1)),
    )  # fmt: skip
    position = {"epoch": 1, "batch_in_epoch": 2, "loader": {"cursor": 5}}
    payload = form.payload(parts, RankStates([capture_rng()], [position]))  # type: ignore[arg-type]
    assert payload is not None and payload["data_per_replica"] == [position]
    restored = form.restore(payload, parts)  # type: ignore[arg-type]
    assert (restored.step, restored.batch_in_epoch, restored.data_position) == (4, 2, position)


class _RankBatches(IterableDataset[Any]):
    """Rank 0 holds ``count`` samples, rank 1 none (a validation stream of one shard)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self) -> Any:
        generator = torch.Generator().manual_seed(5)
        mine = self.count if dist.get_rank() == 0 else 0
        for _ in range(mine):
            yield torch.randn(4, generator=generator), torch.randint(0, 3, (), generator=generator)


def _lockstep_rank(rank: int, init_file: str, out: dict[str, Any]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        calls = []
        model.register_forward_hook(lambda *_: calls.append(1))
        loader = DataLoader(_RankBatches(7), batch_size=2)  # rank 0: 4 batches, rank 1: none
        user = UserCode(ModuleType("m"), lambda: None, "f", None, None)
        precision = resolve_precision(TrainingConfig(), torch.device("cpu"))
        values = evaluate(model, loader, torch.device("cpu"), precision, user, lockstep=True)
        out[rank] = (values, len(calls))
    finally:
        dist.destroy_process_group()


def test_a_lockstep_validation_over_a_stream_pads_the_rank_without_data(tmp_path: Path) -> None:
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_lockstep_rank, args=(str(tmp_path / "init"), out), nprocs=2, join=True)
        results = dict(out)
    (values0, calls0), (values1, calls1) = results[0], results[1]
    assert calls0 == calls1 == 4  # every rank ran the same forward passes
    assert values0 == values1 and set(values0) == {"val_loss", "val_accuracy"}
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    generator = torch.Generator().manual_seed(5)
    pairs = [(torch.randn(4, generator=generator), torch.randint(0, 3, (), generator=generator)) for _ in range(7)]  # fmt: skip
    inputs, targets = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    with torch.no_grad():
        logits = model(inputs)
    want = nn.functional.cross_entropy(logits, targets).item()
    assert values0["val_loss"] == pytest.approx(want, rel=1e-6)
