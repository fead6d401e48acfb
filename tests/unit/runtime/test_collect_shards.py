"""Sharded checkpoints across machines that share no disk: each rank's shard files reach rank
0's staging directory over the process group (two gloo processes here, each with a staging
directory of its own as on two machines), streamed in chunks over a gloo group."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ace3.runtime.checkpoint import shard_transfer
from ace3.runtime.checkpoint.sharded import collect_shards
from ace3.runtime.process.distributed import DistContext


def _rank(rank: int, init_file: str, stagings: list[str]) -> None:
    shard_transfer.CHUNK_BYTES = 64  # (files of several chunks, and one of none)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        staging = Path(stagings[rank])
        staging.mkdir(parents=True, exist_ok=True)
        (staging / f"__{rank}_0.distcp").write_bytes(bytes(range(256)) * 4 + bytes([rank]) * rank)
        (staging / f"__{rank}_1.distcp").write_bytes(b"")
        if rank == 0:
            (staging / ".metadata").write_bytes(b"meta")
        dist.barrier()
        separate = stagings[0] != stagings[1]
        ctx = DistContext(rank, 0 if separate else rank, 2, "gloo", torch.device("cpu"))
        collect_shards(staging, ctx)
    finally:
        dist.destroy_process_group()


def test_every_ranks_shards_reach_rank_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(One machine, one shared staging directory, is what every single-node ZeRO test runs.)"""
    stagings = [str(tmp_path / "node0" / "parts"), str(tmp_path / "node1" / "parts")]
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_rank, args=(str(tmp_path / "init"), stagings), nprocs=2, join=True)
    rank0 = Path(stagings[0])
    assert sorted(p.name for p in rank0.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__0_1.distcp",
        "__1_0.distcp",
        "__1_1.distcp",
    ]
    assert (rank0 / "__1_0.distcp").read_bytes() == bytes(range(256)) * 4 + bytes([1])
    assert (rank0 / "__1_1.distcp").read_bytes() == b""
    assert not Path(stagings[1]).exists(), "the other machine's staging is removed"
