"""``.npz`` datasets: the zip's central directory, every member's ``.npy`` header, and the keys
and arrays the engine reads, without reading the arrays' data.

The engine (``ace3.runtime.data.dataset_files.load_npz``) opens the file with
``np.load(allow_pickle=False)``, reads every member and takes the first key pair of
:data:`KEY_PAIRS` it finds; the two arrays must be numeric, have a leading sample dimension and
the same number of samples. Each of those is certain from the headers alone, as is a member
whose bytes cannot hold the array its header describes (a truncated file).
"""

from __future__ import annotations

import ast
import math
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ace3_server.upload_checks.errors import UploadCheckError

# The engine's accepted (inputs, targets) pairs, in its order of preference (the same constant
# as ace3.runtime.data.dataset_files.KEY_PAIRS, which the server cannot import: it has torch).
KEY_PAIRS = (("inputs", "targets"), ("x", "y"), ("X", "y"), ("features", "labels"))
NPY_MAGIC = b"\x93NUMPY"
MAX_HEADER_BYTES = 10_000
"""numpy's own default ``max_header_size``: a longer header fails ``np.load`` in the engine."""
_SIMPLE_DESCR = re.compile(r"^[<>|=]?([a-zA-Z])(\d*)$")
NUMERIC_KINDS = frozenset("biuf")
"""bool, signed and unsigned integers, floats: what becomes a tensor (complex is refused)."""


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` header says: dtype description, shape, and where the data starts."""

    descr: object
    shape: tuple[int, ...]
    data_offset: int


def expected_keys() -> str:
    return " or ".join(f"{x}/{y}" for x, y in KEY_PAIRS)


def _read_exact(handle: IO[bytes], size: int, what: str) -> bytes:
    data = handle.read(size)
    if len(data) != size:
        raise UploadCheckError(f"{what}: the .npy header is truncated")
    return data


def read_npy_header(handle: IO[bytes], what: str) -> NpyHeader:
    """Parse a ``.npy`` header as numpy does (magic, version 1-3, a length, a dict literal with
    exactly ``descr``, ``fortran_order`` and ``shape``), reading nothing past it."""
    magic = _read_exact(handle, 8, what)
    if magic[:6] != NPY_MAGIC:
        raise UploadCheckError(f"{what}: not a .npy array (its magic bytes are wrong)")
    major = magic[6]
    if major not in (1, 2, 3):
        raise UploadCheckError(f"{what}: unknown .npy format version {major}.{magic[7]}")
    length_bytes = 2 if major == 1 else 4
    (length,) = struct.unpack("<H" if major == 1 else "<I", _read_exact(handle, length_bytes, what))
    if length > MAX_HEADER_BYTES:
        raise UploadCheckError(
            f"{what}: its .npy header is {length} bytes; numpy reads at most {MAX_HEADER_BYTES}"
        )
    raw = _read_exact(handle, length, what)
    try:
        text = raw.decode("utf-8" if major == 3 else "latin1")
        header = ast.literal_eval(text)
    except (UnicodeDecodeError, ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise UploadCheckError(f"{what}: its .npy header is not a Python literal") from exc
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise UploadCheckError(
            f"{what}: its .npy header must be a dict of descr, fortran_order and shape"
        )
    shape = header["shape"]
    if not isinstance(shape, tuple) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise UploadCheckError(f"{what}: its .npy shape {shape!r} is not a tuple of sizes")
    if not isinstance(header["fortran_order"], bool):
        raise UploadCheckError(f"{what}: its .npy fortran_order is not a bool")
    return NpyHeader(header["descr"], shape, 8 + length_bytes + length)


def _item_bytes(descr: object) -> int | None:
    """Bytes per element of a simple dtype description, None when not simple."""
    match = _SIMPLE_DESCR.match(descr) if isinstance(descr, str) else None
    if match is None or not match.group(2):
        return 1 if match is not None and match.group(1) == "?" else None
    size = int(match.group(2))
    return size * 4 if match.group(1) == "U" else size


def _dtype_kind(descr: object) -> str | None:
    match = _SIMPLE_DESCR.match(descr) if isinstance(descr, str) else None
    return match.group(1) if match is not None else None


def _check_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> NpyHeader:
    what = f"member {info.filename!r}"
    try:
        with archive.open(info) as handle:
            header = read_npy_header(handle, what)
    except UploadCheckError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError) as exc:
        raise UploadCheckError(f"{what} cannot be read: {exc}") from exc
    except Exception as exc:  # zlib.error, lzma.LZMAError from a corrupt member
        raise UploadCheckError(f"{what} cannot be read: {type(exc).__name__}") from exc
    kind = _dtype_kind(header.descr)
    if kind == "O" or (isinstance(header.descr, list) and "O" in repr(header.descr)):
        raise UploadCheckError(
            f"{what} holds Python objects (dtype object), which need pickles: the engine "
            "reads arrays without them"
        )
    item = _item_bytes(header.descr)
    if item is not None:
        expected = header.data_offset + math.prod(header.shape) * item
        if info.file_size != expected:
            raise UploadCheckError(
                f"{what} is {info.file_size} bytes but its header describes {expected} "
                f"(shape {header.shape}, dtype {header.descr}): truncated or corrupt"
            )
    return header


def _check_pair(headers: dict[str, NpyHeader], x_key: str, y_key: str) -> None:
    for key in (x_key, y_key):
        kind = _dtype_kind(headers[key].descr)
        if kind not in NUMERIC_KINDS and kind != "?":
            raise UploadCheckError(
                f"array {key!r} has dtype {headers[key].descr!r}; the engine needs numbers "
                "(bool, integers or floats)"
            )
        if not headers[key].shape:
            raise UploadCheckError(f"array {key!r} is a scalar; it needs a sample dimension")
    x_len, y_len = headers[x_key].shape[0], headers[y_key].shape[0]
    if x_len != y_len:
        raise UploadCheckError(
            f"{x_len} {x_key} but {y_len} {y_key} (their first dimensions); they must match"
        )
    if x_len == 0:
        raise UploadCheckError("the dataset is empty (0 samples)")


def check_npz(path: Path) -> list[str]:
    """Check an ``.npz`` dataset (see the module docstring); return its keys."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise UploadCheckError(f"not a readable .npz (zip) archive: {exc}") from exc
    with archive:
        infos = [info for info in archive.infolist() if not info.is_dir()]
        if not infos:
            raise UploadCheckError(f"the .npz archive holds no arrays; expected {expected_keys()}")
        headers: dict[str, NpyHeader] = {}
        for info in infos:
            key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            headers[key] = _check_member(archive, info)
    for x_key, y_key in KEY_PAIRS:
        if x_key in headers and y_key in headers:
            _check_pair(headers, x_key, y_key)
            return sorted(headers)
    raise UploadCheckError(f"expected arrays {expected_keys()}; found {sorted(headers)}")
