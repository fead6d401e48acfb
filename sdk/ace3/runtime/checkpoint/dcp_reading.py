"""Reading a ``torch.distributed.checkpoint`` (DCP) directory without running pickled code.

DCP keeps two kinds of pickle: the ``.metadata`` file (what the checkpoint holds and where,
as torch's own dataclasses) and the state dict's non-tensor values (an optimizer's
``param_groups``: numbers, tuples, strings). torch reads the first with ``pickle.load`` and
the second with ``torch.load(weights_only=False)``, and either runs whatever a crafted file
names. Here, instead:

- the metadata is unpickled by :class:`MetadataUnpickler`, which resolves only the classes a
  DCP metadata pickle is made of (``METADATA_GLOBALS``: what the metadata of every ZeRO
  stage's checkpoint references, found by disassembling them, plus torch's dtypes); a pickle
  naming anything else (``os.system``, ``builtins.exec``, ``pathlib.Path.write_text``) is
  refused before any of it runs;
- the metadata is then checked (:func:`checked_metadata`): every entry reads a ``.distcp``
  file of the directory, inside its bounds (never a path outside it), and the tensors it
  describes fit in the bytes the directory holds (a few bytes cannot ask for terabytes);
- the non-tensor values are read with ``torch.load(weights_only=True)``
  (:class:`WeightsOnlyLoadPlanner`); DCP reads the tensor data weights-only itself.

Every read of a DCP directory goes through :func:`load_dcp` (a sharded job resumes) or
:func:`load_whole_dcp` (a checkpoint consolidated into one state).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import math
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    _EmptyStateDictLoadPlanner,
)
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from ace3.errors import UnsafeCheckpointError

METADATA_FILE = ".metadata"
DATA_SUFFIX = ".distcp"
METADATA_GLOBALS: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),  # a layout from its name
    "torch": frozenset(
        {"Size"} | {name for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
    ),
    "pathlib": frozenset({"PosixPath", "PurePosixPath"}),  # StorageMeta.checkpoint_id
}
# What a BUILD may give state to: DCP's metadata dataclasses (instances, never classes).
_BUILDABLE = frozenset(
    value
    for module in (
        "torch.distributed.checkpoint.metadata",
        "torch.distributed.checkpoint.filesystem",
    )
    for name in METADATA_GLOBALS[module]
    if isinstance(value := getattr(importlib.import_module(module), name), type)
    and dataclasses.is_dataclass(value)
)


class MetadataUnpickler(pickle._Unpickler):
    """An unpickler that resolves only ``METADATA_GLOBALS`` (each of them only builds a value:
    a dataclass, a ``torch.Size``, a dtype, a path) and applies state (``BUILD``) only to an
    instance of one of DCP's metadata dataclasses, and only its fields (a dict of them, or the
    tuple a dataclass's own ``__setstate__`` takes): ``BUILD`` applied to a
    class would set that class's attributes for the whole process (``pathlib.PosixPath._str``:
    every path opened later would name a file the checkpoint chose). The pure-Python
    unpickler, whose opcodes can be overridden; metadata is small."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        if name in METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"the checkpoint's DCP metadata names {module}.{name}, which unpickling would have "
            "to import and could run: it is not a torch.distributed.checkpoint checkpoint as "
            "torch writes one, and is refused"
        )

    def load_build(self) -> None:
        state, target = self.stack[-1], self.stack[-2]  # type: ignore[attr-defined]  # (not in the stubs)
        kind = type(target)
        names = {field.name for field in dataclasses.fields(kind)} if kind in _BUILDABLE else None
        if names is not None and "__setstate__" in vars(kind):
            fits = isinstance(state, tuple)  # (TensorProperties': its own fields, from a tuple)
        else:
            fits = names is not None and isinstance(state, dict) and set(state) <= names
        if not fits:
            what = f"the class {target.__qualname__}" if isinstance(target, type) else kind.__name__
            raise UnsafeCheckpointError(
                f"the checkpoint's DCP metadata sets the state of {what} in a way "
                "torch never writes (only the fields of DCP's metadata dataclasses are): refused"
            )
        super().load_build()  # type: ignore[misc]  # (not in the stubs)

    dispatch[pickle.BUILD[0]] = load_build  # type: ignore[assignment]  # (takes this subclass)


def read_metadata(directory: Path) -> Metadata:
    """The checked metadata of the DCP directory ``directory`` (UnsafeCheckpointError when it
    would run code or reach outside the directory; ValueError when it is not DCP metadata)."""
    path = directory / METADATA_FILE
    try:
        with path.open("rb") as handle:
            metadata = MetadataUnpickler(handle).load()
    except UnsafeCheckpointError:
        raise
    except Exception as exc:  # truncated or malformed: whatever pickle raised
        raise ValueError(f"{path} is not DCP metadata ({type(exc).__name__}: {exc})") from None
    try:
        return checked_metadata(metadata, directory)
    except AttributeError as exc:  # an object the pickle built without its fields
        raise ValueError(f"{path} is not DCP metadata ({exc})") from None


def _is_shape(value: object) -> bool:
    return isinstance(value, torch.Size) and all(type(n) is int and n >= 0 for n in value)


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def _check_storage(metadata: Metadata, files: dict[str, int]) -> None:
    """Every storage entry reads inside a ``.distcp`` file of the directory."""
    if not isinstance(metadata.storage_data, dict):
        raise ValueError("the DCP metadata has no storage entries")
    for index, info in metadata.storage_data.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise ValueError(f"the DCP metadata has a storage entry of {type(info).__name__}")
        name, offset, length = info.relative_path, info.offset, info.length
        if not isinstance(name, str) or not name.endswith(DATA_SUFFIX) or name not in files:
            raise UnsafeCheckpointError(
                f"the checkpoint's DCP metadata reads {index.fqn!r} from {name!r}, which is not "
                "a data file of the checkpoint"
            )
        if not (_is_count(offset) and _is_count(length)) or offset + length > files[name]:
            raise UnsafeCheckpointError(
                f"the checkpoint's DCP metadata reads {index.fqn!r} past the end of {name}"
            )
        descriptors = getattr(info, "transform_descriptors", None)
        if descriptors is not None and not (
            isinstance(descriptors, list | tuple) and all(isinstance(d, str) for d in descriptors)
        ):
            raise ValueError(f"the DCP metadata's transforms of {index.fqn!r} are not names")


def _tensor_bytes(fqn: str, item: object) -> int:
    """The size of the tensor ``item`` describes (ValueError unless it is well formed)."""
    if isinstance(item, BytesStorageMetadata):
        return 0
    if not (
        isinstance(item, TensorStorageMetadata)
        and isinstance(item.properties, TensorProperties)
        and isinstance(item.properties.dtype, torch.dtype)
        and _is_shape(item.size)
        and isinstance(item.chunks, list)
        and all(
            isinstance(chunk, ChunkStorageMetadata)
            and _is_shape(chunk.offsets)
            and _is_shape(chunk.sizes)
            for chunk in item.chunks
        )
    ):
        raise ValueError(f"the DCP metadata of {fqn!r} does not describe a tensor")
    return math.prod(item.size) * item.properties.dtype.itemsize


def _check_layout(metadata: Metadata, limit: int) -> None:
    """Nesting paths (``planner_data``) of plain keys, list indexes within the entry count (a
    huge index would make a huge list); the tensors' bytes within ``limit``."""
    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict) or not all(isinstance(fqn, str) for fqn in entries):
        raise ValueError("the DCP metadata's entries are not named by strings")
    nesting = metadata.planner_data if metadata.planner_data is not None else {}
    if not isinstance(nesting, dict) or not all(
        isinstance(path, tuple | list)
        and all(
            isinstance(key, str) or (type(key) is int and 0 <= key <= len(entries)) for key in path
        )
        for path in nesting.values()
    ):
        raise ValueError("the DCP metadata's nesting paths are not keys and list positions")
    total = sum(_tensor_bytes(fqn, item) for fqn, item in entries.items())
    if total > limit:
        raise UnsafeCheckpointError(
            f"the checkpoint's DCP metadata describes {total:,} bytes of tensors, but its data "
            f"files hold {limit:,}"
        )


def checked_metadata(metadata: object, directory: Path) -> Metadata:
    """``metadata`` (unpickled from ``directory``'s metadata file), refused unless it reads
    only the directory's own data files and describes no more than they hold."""
    if not isinstance(metadata, Metadata):
        raise ValueError(f"{directory / METADATA_FILE} holds {type(metadata).__name__}")
    if metadata.storage_meta is not None and not isinstance(metadata.storage_meta, StorageMeta):
        raise ValueError("the DCP metadata's storage_meta is not StorageMeta")
    files = {path.name: path.stat().st_size for path in directory.iterdir() if path.is_file()}
    _check_storage(metadata, files)
    data_bytes = sum(size for name, size in files.items() if name.endswith(DATA_SUFFIX))
    _check_layout(metadata, data_bytes)
    return metadata


class CheckedFileSystemReader(FileSystemReader):
    """torch's filesystem reader of ``directory``, giving DCP the metadata
    :func:`read_metadata` read and checked when the reader was made: before DCP runs, so that
    a refusal is raised as itself (DCP wraps what its reader raises in a CheckpointException),
    on every rank alike."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.checked = read_metadata(directory)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.checked.storage_meta is None:
            self.checked.storage_meta = StorageMeta()
        self.checked.storage_meta.load_id = self.load_id
        return self.checked


def _weights_only_value(
    planner: DefaultLoadPlanner, read_item: ReadItem, value: io.BytesIO
) -> None:
    """What ``DefaultLoadPlanner.load_bytes`` does, but reading weights-only."""
    fqn = read_item.dest_index.fqn
    try:
        loaded = torch.load(value, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpointError(
            f"the checkpoint's value {fqn!r} holds Python objects that loading would have to "
            f"run (weights-only loading refused them: {str(exc).splitlines()[0]})"
        ) from None
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[fqn], loaded)
    else:
        planner.state_dict[fqn] = loaded


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor values weights-only."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _weights_only_value(self, read_item, value)


class _WholeStateLoadPlanner(_EmptyStateDictLoadPlanner):
    """DCP's planner that rebuilds the whole state dict from the metadata (what
    ``dcp_to_torch_save`` uses), reading non-tensor values weights-only."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _weights_only_value(self, read_item, value)


@contextlib.contextmanager
def _refusals_unwrapped() -> Iterator[None]:
    """A refusal raised while DCP reads (a value that would run code, on any rank) as
    UnsafeCheckpointError rather than inside DCP's CheckpointException."""
    try:
        yield
    except CheckpointException as exc:
        for failure, _trace in exc.failures.values():
            if isinstance(failure, UnsafeCheckpointError):
                raise UnsafeCheckpointError(str(failure)) from exc
        raise


def load_dcp(state: dict[str, Any], directory: Path) -> None:
    """``dcp.load(state, ...)`` from ``directory`` (resharding into ``state``'s tensors), safely.
    A collective when a process group is initialised."""
    import torch.distributed.checkpoint as dcp

    reader = CheckedFileSystemReader(directory)
    with _refusals_unwrapped():
        dcp.load(state, storage_reader=reader, planner=WeightsOnlyLoadPlanner())


def load_whole_dcp(directory: Path) -> dict[str, Any]:
    """Every value of the DCP checkpoint in ``directory``, in one process (no process group),
    nested as saved: ``dcp_to_torch_save`` without the file, safely."""
    state: dict[str, Any] = {}
    reader = CheckedFileSystemReader(directory)
    with _refusals_unwrapped():
        _load_state_dict(
            state, storage_reader=reader, planner=_WholeStateLoadPlanner(), no_dist=True
        )
    return state
