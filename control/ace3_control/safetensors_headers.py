"""A safetensors file's header, read and checked without torch: an 8-byte little-endian header
length, a JSON object naming each tensor's dtype, shape and byte range, then the bytes. A file
that passes holds tensors and nothing else (no code, no object to unpickle), and its byte
ranges tile the data exactly, as the safetensors library itself requires."""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

from ace3_control.check_errors import UploadCheckError

MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_TENSORS = 200_000
MAX_DIMENSIONS = 64
MAX_DIMENSION = 2**63 - 1
MAX_NAME_LENGTH = 1000
# JSON items (commas and containers outside strings) a header may hold per tensor it may hold:
# a tensor's entry has 3 containers and 4 + ndims commas (real shapes have at most 5 sizes), so
# 16 is generous; SLACK_ITEMS covers the outer object and a small __metadata__.
ITEMS_PER_TENSOR = 16
SLACK_ITEMS = 1024
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# safetensors dtypes and their size in bits
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
}  # fmt: skip


def _check_entry(name: str, entry: object, data_bytes: int) -> tuple[int, int]:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise UploadCheckError(f"tensor {name!r}: expected dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_BITS:
        raise UploadCheckError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMENSIONS
        or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIMENSION
            for d in shape
        )
    ):
        raise UploadCheckError(
            f"tensor {name!r}: shape must be a list of at most {MAX_DIMENSIONS} sizes >= 0"
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise UploadCheckError(
            f"tensor {name!r}: data_offsets must be [begin, end] within the data"
        )
    expected = math.prod(shape) * DTYPE_BITS[dtype] // 8  # at most 64 sizes: cheap
    if offsets[1] - offsets[0] != expected:
        raise UploadCheckError(
            f"tensor {name!r}: {offsets[1] - offsets[0]} bytes for its shape of {dtype} "
            f"(expected {expected if expected <= data_bytes else 'more than the file holds'})"
        )
    return offsets[0], offsets[1]


def json_item_count(raw: bytes) -> int:
    """How many commas, ``[`` and ``{`` the JSON text ``raw`` holds outside its strings: a bound
    on the values ``json.loads`` would build (each costs tens of bytes, so a few MB of
    ``[],[],...`` cost hundreds of MB), counted with two C scans before parsing anything."""
    bare = _JSON_STRING.sub(b"", raw)
    return bare.count(b",") + bare.count(b"[") + bare.count(b"{")


def read_safetensors_shapes(path: Path, max_tensors: int = MAX_TENSORS) -> dict[str, list[int]]:
    """Each tensor's shape, by name, in the safetensors file at ``path``; UploadCheckError
    saying what is wrong otherwise (byte ranges must tile the data exactly, at most
    ``max_tensors`` tensors, and a header whose JSON is no larger than they need)."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise UploadCheckError("too short for a safetensors file")
        (header_bytes,) = struct.unpack("<Q", prefix)
        if header_bytes > min(MAX_HEADER_BYTES, size - 8):
            raise UploadCheckError("not a safetensors file (bad header length)")
        raw = handle.read(header_bytes)
    if json_item_count(raw) > ITEMS_PER_TENSOR * max_tensors + SLACK_ITEMS:  # bounded memory
        raise UploadCheckError(f"more than {max_tensors} tensors' worth of header")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError, MemoryError):  # (JSONDecodeError, UnicodeDecodeError,
        # and integers past Python's digit limit are ValueErrors)
        raise UploadCheckError("not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise UploadCheckError("not a safetensors file (its header is not an object)")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise UploadCheckError("__metadata__ must map strings to strings")
    if not header:
        raise UploadCheckError("the file holds no tensor")
    if len(header) > max_tensors:
        raise UploadCheckError(f"more than {max_tensors} tensors")
    data_bytes = size - 8 - header_bytes
    ranges = []
    for name, entry in header.items():
        if not name or len(name) > MAX_NAME_LENGTH:
            raise UploadCheckError("tensor names must be 1 to 1000 characters")
        ranges.append(_check_entry(name[:200], entry, data_bytes))
    position = 0
    for begin, end in sorted(ranges):
        if begin != position:
            raise UploadCheckError("the tensors' byte ranges overlap or leave gaps")
        position = end
    if position != data_bytes:
        raise UploadCheckError(f"the tensors take {position} bytes but the file holds {data_bytes}")
    return {name: entry["shape"] for name, entry in header.items()}
