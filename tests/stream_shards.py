"""Tiny shards of every streamed format, written for tests, and the job spec that streams them.

Each writer puts one shard file into a directory under the flat name a job gives it
(``000003.parquet``, :func:`ace3.config.shards.shard_file_name`); :func:`stream_dataset` builds
the ``DatasetSpec`` of a directory's shards (sizes from the files, parquet counts from their
footers), with the request directory beside it.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ace3.config.shards import SHARD_SUFFIXES
from ace3.runtime.job_spec import DatasetSpec, StreamShard, StreamSpec


def write_parquet(
    path: Path, inputs: Sequence[Any], targets: Sequence[Any], row_group_size: int = 4
) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"inputs": list(inputs), "targets": list(targets)})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_jsonl(path: Path, records: Sequence[dict[str, Any] | str]) -> Path:
    """One line a record (a string is written as is); .gz and .zst compress it."""
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()
    if path.name.endswith(".gz"):
        text = gzip.compress(text)
    elif path.name.endswith(".zst"):
        import zstandard

        text = zstandard.ZstdCompressor().compress(text)
    path.write_bytes(text)
    return path


def write_tokens(path: Path, tokens: Sequence[int], dtype: str = "uint16") -> Path:
    np.asarray(tokens, dtype=dtype).tofile(path)
    return path


def write_tar(path: Path, members: Sequence[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def stream_dataset(
    directory: Path,
    format: str,
    *,
    samples: Sequence[int | None] | None = None,
    dtype: str | None = None,
    columns: dict[str, str] | None = None,
    files: Sequence[str] | None = None,
) -> DatasetSpec:
    """The spec of the format's shard files in ``directory`` (sorted; or ``files``): sizes
    from the files, sample counts from ``samples`` (else parquet's from their footers)."""
    names = (
        list(files)
        if files is not None
        else sorted(p.name for p in directory.iterdir() if p.name.endswith(SHARD_SUFFIXES[format]))
    )
    shards = []
    for number, name in enumerate(names):
        path = directory / name
        count = samples[number] if samples is not None else None
        if count is None and format == "parquet" and samples is None:
            import pyarrow.parquet as pq

            count = pq.ParquetFile(path).metadata.num_rows
        shards.append(StreamShard(file=name, size=path.stat().st_size, samples=count))
    return DatasetSpec(
        path=str(directory),
        stream=StreamSpec.model_validate(
            {
                "format": format,
                "dtype": dtype,
                "columns": columns,
                "shards": [s.model_dump() for s in shards],
                "requests": str(directory.parent / "shard-requests"),
            }
        ),
    )


JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
TOKENS_LENGTH = 2  # the sequence_length numbered tokens shards are written for


def numbered_shards(directory: Path, format: str, sizes: Sequence[int]) -> DatasetSpec:
    """Shards of ``sizes`` samples whose samples are numbered 0, 1, ... across the dataset
    (:func:`sample_id` reads the number back); tokens shards are for ``sequence_length=2``."""
    directory.mkdir(parents=True, exist_ok=True)
    first = 0
    names = []
    for index, size in enumerate(sizes):
        ids = list(range(first, first + size))
        first += size
        if format == "parquet":
            name = f"{index:06d}.parquet"
            write_parquet(directory / name, [[float(i), 0.5] for i in ids], ids, row_group_size=3)
        elif format == "jsonl":
            name = f"{index:06d}{JSONL_SUFFIXES[index % 3]}"
            write_jsonl(directory / name, [{"inputs": [i], "target": i} for i in ids])
        elif format == "tokens":
            name = f"{index:06d}.bin"
            tokens = [t for i in ids for t in (i, 0)] + [0]
            write_tokens(directory / name, tokens)
        else:
            name = f"{index:06d}.tar"
            write_tar(directory / name, [(f"s{i:05d}.cls", str(i).encode()) for i in ids])
        names.append(name)
    counts = list(sizes) if format == "parquet" else None  # tokens: counted from sizes
    return stream_dataset(directory, format, files=names, samples=counts)


def sample_id(sample: Any) -> int:
    """The number of a sample of :func:`numbered_shards`."""
    if isinstance(sample, tuple):
        return int(sample[1])
    if "input_ids" in sample:
        return int(sample["input_ids"][0])
    return int(sample["cls"])
