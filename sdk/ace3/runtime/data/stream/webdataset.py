"""WebDataset shards: tar files read as a stream, one sample per key.

A sample is the run of consecutive members that share a key: the member's path up to the first
``.`` of its base name (``train/0001.seg.png`` has key ``train/0001`` and extension
``seg.png``). The sample is a dict keyed by extension (the key itself is not in it), each value
decoded by its last extension:

- ``.npy``: a tensor (``allow_pickle=False``; uint8 stays uint8, other floats and bools become
  float32, other integers int64, as for every other format);
- ``.pt``/``.pth``: ``torch.load(weights_only=True)``;
- ``.json``: the parsed value; ``.txt``: the text; ``.cls``: an int64 scalar tensor;
- ``.jpg``/``.jpeg``/``.png``: a uint8 tensor ``[C, H, W]`` (Pillow needed);
- anything else: the raw bytes.

Members before the sample a reader starts at are skipped without reading their data.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ace3.runtime.data.dataset_files import normalize_dtype

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png")


def member_key(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member's path, or None for one without an extension or with a
    hidden base name (``.DS_Store``)."""
    directory, _, base = name.rpartition("/")
    stem, dot, extension = base.partition(".")
    if not dot or not stem or not extension:
        return None
    return (f"{directory}/{stem}" if directory else stem), extension


def webdataset_samples(path: Path, start: int = 0) -> Generator[dict[str, Any], None, None]:
    """The shard's samples from index ``start`` on."""
    try:
        with tarfile.open(path, mode="r|") as archive:
            yield from _grouped(archive, path, start)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ValueError(f"{path}: not a readable tar file: {exc}") from exc


def _grouped(archive: tarfile.TarFile, path: Path, start: int) -> Iterator[dict[str, Any]]:
    key: str | None = None
    index = -1
    sample: dict[str, Any] = {}
    for member in archive:
        named = member_key(member.name) if member.isfile() else None
        if named is None:
            continue
        if named[0] != key:
            if sample:
                yield sample
            key, index, sample = named[0], index + 1, {}
        if index < start:  # skipped: the data is never read
            continue
        if named[1] in sample:
            raise ValueError(f"{path}: member {member.name!r} repeats its sample's key")
        handle = archive.extractfile(member)
        data = handle.read() if handle is not None else b""
        sample[named[1]] = decode(named[1], data, f"{path}: member {member.name!r}")
    if sample:
        yield sample


def decode(extension: str, data: bytes, where: str) -> Any:
    """One member's value, by its last extension."""
    kind = extension.rpartition(".")[2].lower()
    try:
        if kind == "npy":
            array = np.load(io.BytesIO(data), allow_pickle=False)
            tensor = torch.from_numpy(np.array(array))
            return tensor if tensor.dtype == torch.uint8 else normalize_dtype(tensor)
        if kind in ("pt", "pth"):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if kind == "json":
            return json.loads(data.decode("utf-8"))
        if kind == "txt":
            return data.decode("utf-8")
        if kind == "cls":
            return torch.tensor(int(data.decode("utf-8").strip()), dtype=torch.int64)
        if kind in IMAGE_EXTENSIONS:
            return _image(data)
    except Exception as exc:
        raise ValueError(f"{where}: cannot decode as .{kind}: {exc}") from exc
    return data


def _image(data: bytes) -> torch.Tensor:
    try:
        from PIL import Image
    except ImportError:
        raise ValueError("decoding images needs Pillow (pip install pillow)") from None
    with Image.open(io.BytesIO(data)) as opened:
        image = opened if opened.mode in ("L", "RGB", "RGBA") else opened.convert("RGB")
        array = np.array(image, dtype=np.uint8)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()
