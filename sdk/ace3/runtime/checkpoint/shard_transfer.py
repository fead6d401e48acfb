"""Bring every rank's sharded-checkpoint files to rank 0 when the ranks share no disk (the
nodes of a multi-node job): the files stream over a CPU (gloo) process group in fixed-size
chunks, so neither side ever holds more than one chunk of a file in memory, and no GPU memory
is used (``gather_object`` would pad every rank's files to the largest and stage them all on
rank 0's device)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ace3.runtime.process.distributed import DistContext, barrier

CHUNK_BYTES = 16 * 1024 * 1024

_cpu_groups: dict[int, Any] = {}


def cpu_group(ctx: DistContext) -> Any:
    """A gloo group of every rank (the default group when it is gloo already); made once per
    default group. A collective the first time: every rank calls it."""
    if ctx.backend == "gloo":
        return None
    default = id(dist.distributed_c10d._get_default_group())
    if default not in _cpu_groups:
        _cpu_groups[default] = dist.new_group(backend="gloo")
    return _cpu_groups[default]


def _check_name(name: str) -> None:
    if not name.startswith("__") or not name.endswith(".distcp") or "/" in name or ".." in name:
        raise ValueError(f"unexpected shard file name {name!r}")


def _send(path: Path, size: int, group: Any) -> None:
    with path.open("rb") as handle:
        left = size
        while left:
            data = handle.read(min(CHUNK_BYTES, left))
            if not data:
                raise RuntimeError(f"{path.name} shrank while it was sent to rank 0")
            dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst=0, group=group)
            left -= len(data)


def _receive(path: Path, size: int, source: int, group: Any) -> None:
    buffer = torch.empty(min(CHUNK_BYTES, size), dtype=torch.uint8)
    with path.open("wb") as handle:
        left = size
        while left:
            chunk = buffer[: min(CHUNK_BYTES, left)]
            dist.recv(chunk, src=source, group=group)
            handle.write(chunk.numpy().tobytes())
            left -= chunk.numel()


def collect_shards(staging: Path, ctx: DistContext) -> None:
    """Bring every rank's shard files into rank 0's staging directory, so that rank 0 packs
    them all: a rank on another machine (no disk shared with rank 0) streams rank 0 the files
    it wrote (``__<rank>_<n>.distcp``), and its machine's staging directory is removed. A
    collective, after ``dcp.save``; ranks that share rank 0's filesystem send nothing."""
    if ctx.world_size == 1:
        return
    group = cpu_group(ctx)
    listing = [sorted(p.name for p in staging.iterdir()) if ctx.is_main else None]
    dist.broadcast_object_list(listing, src=0, group=group)
    visible = set(listing[0] or [])
    own = sorted(staging.glob(f"__{ctx.rank}_*.distcp"))
    missing = [(p, p.stat().st_size) for p in own if p.name not in visible]
    manifests: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object([(p.name, size) for p, size in missing], manifests, dst=0, group=group)
    if manifests is not None:
        for source, files in enumerate(manifests):
            for name, size in files or []:
                _check_name(name)
                _receive(staging / name, int(size), source, group)
    else:
        for path, size in missing:
            _send(path, size, group)
    elsewhere = bool(missing) and ctx.local_rank == 0
    barrier(ctx)  # (every rank of this machine has sent its files)
    if elsewhere:
        shutil.rmtree(staging, ignore_errors=True)
