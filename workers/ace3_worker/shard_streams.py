"""A streamed dataset in a job's directory: what ``job.json`` tells the engine about it
(:class:`ace3.runtime.job_spec.StreamSpec`) and what the attempt's feeder
(:mod:`ace3_worker.shard_feed`) needs to fill its directory.

A dataset whose row carries a manifest (``kind`` "remote": registered from a bucket; "shards":
an uploaded shard directory, its shards in the artifact store) gets ``data/<split>/shards/``, the worker's (0755: the job reads it, through ``/job`` read-only under
bubblewrap), empty when the attempt starts; its shards appear there, read-only and whole, as the
readers ask for them in ``output/shard-requests/`` (the job's own, writable), shared by both
splits.

:func:`plan_readers` says, from the job's config, which request files the attempt's readers
write (``<split>-r<replica>-w<worker>.json`` for this node's data-parallel replicas, ``max(1,
num_workers)`` loader workers and each streamed split) and what the attempt may keep linked:
its share of the node cache (``ACE3_DATASET_CACHE_BYTES / ACE3_WORKER_SLOTS``), refused when
the shards its readers read at once (the largest ones, at worst) cannot fit in it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from ace3.config import TrainingConfig, parallel_degrees
from ace3.config.shards import REQUEST_DIR, Shard, ShardManifest, request_file_name, shard_file_name
from ace3.runtime.job_spec import DatasetSpec, StreamShard, StreamSpec
from ace3_control.models import StoredDataset
from ace3_worker.shard_cache import entry_floor

Split = Literal["train", "validation"]
SHARDS_DIR = "shards"
STREAMED_KINDS = ("remote", "shards")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ShardStream:
    """One streamed split of an attempt: its manifest, the shards' file names (in the manifest's
    order) and the directory (the real path) they are linked into."""

    split: Split
    manifest: ShardManifest
    directory: Path
    files: tuple[str, ...]
    digest: str
    kind: str  # the dataset's: where its shards are read from (ace3_worker.shard_fetch)
    _by_file: dict[str, Shard] = field(repr=False, compare=False)

    def shard(self, file: str) -> Shard:
        return self._by_file[file]


def manifest_of(dataset: StoredDataset) -> ShardManifest | None:
    """The dataset's manifest when it is streamed, else None (a file or an archive)."""
    if dataset.kind not in STREAMED_KINDS:
        return None
    raw = dataset.manifest
    if raw is None:
        raise ValueError(f"dataset {dataset.id} is {dataset.kind!r} but has no shard manifest")
    manifest = ShardManifest.model_validate(raw)
    if dataset.kind == "shards":
        _check_stored(dataset, manifest)
    return manifest


def _check_stored(dataset: StoredDataset, manifest: ShardManifest) -> None:
    """An uploaded shard directory reads its owner's stored shards only: ``uri`` is the owner's
    shard prefix and every ``etag`` a sha256 (the store's key is ``uri + etag``)."""
    prefix = f"datasets/{dataset.owner_id}/shards/"
    if manifest.uri != prefix:
        raise ValueError(
            f"dataset {dataset.id}'s manifest uri {manifest.uri!r} is not its owner's shard "
            f"prefix {prefix!r}"
        )
    for shard in manifest.shards:
        if not _SHA256.fullmatch(shard.etag):
            raise ValueError(
                f"dataset {dataset.id}'s shard {shard.name!r} has no sha256 in its manifest "
                f"(etag {shard.etag!r})"
            )


def check_fits(manifest: ShardManifest, cache_bytes: int) -> None:
    """Refuse a dataset one of whose shards is larger than the whole node cache."""
    for shard in manifest.shards:
        if shard.size > cache_bytes:
            raise ValueError(
                f"dataset shard {shard.name!r} is {shard.size} bytes, more than this worker's "
                f"dataset cache holds (ACE3_DATASET_CACHE_BYTES={cache_bytes}): raise it, or "
                "split the shard"
            )


def stream_dataset(
    split: Split,
    manifest: ShardManifest,
    into: Path,
    requests: Path,
    visible: Callable[[Path], PurePosixPath],
    *,
    kind: str = "remote",
) -> tuple[dict[str, Any], ShardStream]:
    """Make ``into/shards/`` (empty; the worker's) and return the job file's dataset entry and
    the stream the feeder fills it from. ``requests``: the readers' request directory;
    ``kind``: the dataset's (one of :data:`STREAMED_KINDS`)."""
    if kind not in STREAMED_KINDS:
        raise ValueError(f"a {kind!r} dataset is not streamed")
    directory = into / SHARDS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    files = tuple(shard_file_name(i, s, manifest.format) for i, s in enumerate(manifest.shards))
    spec = DatasetSpec(
        path=str(visible(directory)),
        stream=StreamSpec(
            format=manifest.format,
            dtype=manifest.dtype,
            columns=manifest.columns,
            shards=[
                StreamShard(file=file, size=shard.size, samples=shard.samples)
                for file, shard in zip(files, manifest.shards, strict=True)
            ],
            requests=str(visible(requests)),
        ),
    )
    stream = ShardStream(
        split,
        manifest,
        directory,
        files,
        manifest.digest(),
        kind,
        dict(zip(files, manifest.shards, strict=True)),
    )
    return spec.model_dump(mode="json"), stream


def open_shard_dirs(streams: tuple[ShardStream, ...]) -> None:
    """After the inputs are frozen (0555): the shard directories writable again by the worker
    alone (0755), which links shards in and out while the job reads them."""
    for stream in streams:
        os.chmod(stream.directory, 0o755)


def requests_dir(output_dir: Path) -> Path:
    return output_dir / REQUEST_DIR


@dataclass(frozen=True)
class Readers:
    """An attempt's shard readers: the request files they write, the most bytes their current
    shards hold at once (counted as the cache counts them), and the attempt's share of the
    cache (what it may keep linked)."""

    names: frozenset[str]
    current_bytes: int
    share: int


def _replicas(config: Mapping[str, Any], processes: int, node_rank: int | None) -> set[int]:
    """The data-parallel replicas (a request file's ``r``) of this node's ranks: all of the
    job's on a single node, those of ranks ``node_rank * per_node ...`` on a gang's node."""
    try:
        pp, tp = parallel_degrees(TrainingConfig.model_validate(dict(config)), processes)
    except (ValueError, TypeError):
        return set(range(processes))  # (the engine refuses it; any replica of the job)
    nodes = max(1, int(config.get("num_nodes", 1) or 1))
    per_node = max(1, processes // nodes)
    ranks = (
        range(processes)
        if node_rank is None
        else range(node_rank * per_node, (node_rank + 1) * per_node)
    )
    return {rank // max(1, pp * tp) for rank in ranks}


def plan_readers(
    config: Mapping[str, Any] | None,
    processes: int,
    node_rank: int | None,
    streams: tuple[ShardStream, ...],
    *,
    validation_given: bool,
    cache_bytes: int,
    slots: int,
) -> Readers:
    """The readers of an attempt's streamed splits (see the module docstring); raises
    ``ValueError`` naming num_workers, the ranks and ACE3_DATASET_CACHE_BYTES when their current
    shards cannot fit in the attempt's share of the cache."""
    config = config or {}
    workers = max(1, int(config.get("num_workers", 0) or 0))
    replicas = _replicas(config, processes, node_rank)
    by_split = {stream.split: stream for stream in streams}
    train = by_split.get("train")
    if "validation" not in by_split and train is not None and not validation_given:
        held_out = config.get("validation_split") != 0 and len(train.files) > 1
        if held_out:
            by_split["validation"] = train  # (its readers ask for held-out train shards)
    names = frozenset(
        request_file_name(split, replica, worker)
        for split in by_split
        for replica in replicas
        for worker in range(workers)
    )
    floor = entry_floor(cache_bytes)
    per_split = len(replicas) * workers
    current = 0
    for stream in {id(s): s for s in by_split.values()}.values():
        count = per_split * sum(1 for s in by_split.values() if s is stream)
        sizes = sorted((max(s.size, floor) for s in stream.manifest.shards), reverse=True)
        current += sum(sizes[:count])
    share = cache_bytes // max(1, slots)
    if current > share:
        raise ValueError(
            f"dataset streaming: {per_split * len(by_split)} readers ({len(replicas)} data-"
            f"parallel rank(s) x num_workers={workers} loader worker(s) x {len(by_split)} "
            f"split(s)) may each read a shard at once, up to {current} bytes, more than this "
            f"job's share of the dataset cache ({share} bytes: ACE3_DATASET_CACHE_BYTES="
            f"{cache_bytes} / ACE3_WORKER_SLOTS={slots}): lower num_workers, raise "
            "ACE3_DATASET_CACHE_BYTES, or split the dataset into smaller shards"
        )
    return Readers(names, current, share)
