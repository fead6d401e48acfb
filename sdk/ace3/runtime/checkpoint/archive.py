"""The file of a sharded (ZeRO) checkpoint: one uncompressed tar of a
``torch.distributed.checkpoint`` directory plus ``train_state.pt``.

What the archive holds, how it is written (packed atomically) and read back (its members
checked: plain, not sparse, files at the top level only; extracted once per machine), and where
shards are staged. What goes into it and how it is loaded into a sharded model is
:mod:`ace3.runtime.checkpoint.sharded`.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ace3.errors import UnsafeCheckpointError
from ace3.files import WrittenFile, write_atomic
from ace3.runtime.process.distributed import DistContext, barrier

SHARDED_FORMAT = 2
ARCHIVE_SUFFIX = ".dcp.tar"
TRAIN_STATE = "train_state.pt"


def sharded_checkpoint_name(step: int) -> str:
    return f"step-{step:08d}{ARCHIVE_SUFFIX}"


def pack(directory: Path, target: Path) -> WrittenFile:
    """One uncompressed tar of ``directory``'s files (flat, sorted), written atomically."""

    def write(handle: Any) -> None:
        with tarfile.open(fileobj=handle, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(directory.iterdir()):
                tar.add(path, arcname=path.name, recursive=False)

    return write_atomic(target, write)


def shared_temp_dir(ctx: DistContext) -> Path:
    """A directory name under the system's temporary directory that every rank agrees on (a
    collective): where to stage shards that must not appear in a watched directory."""
    token = [uuid.uuid4().hex if ctx.is_main else None]
    if ctx.world_size > 1:
        dist.broadcast_object_list(token, src=0)
    return Path(tempfile.gettempdir()) / f"ace3-dcp-{token[0]}"


def is_sharded_archive(path: Path) -> bool:
    """A tar file (what sharded jobs write); plain checkpoints are torch's zip format."""
    try:
        return tarfile.is_tarfile(path)
    except OSError:
        return False


def _members(tar: tarfile.TarFile, path: Path) -> list[tarfile.TarInfo]:
    """The archive's files, refused unless every one is a plain file with a plain name: no
    link, directory or device, no path out of the directory it is extracted into, and no
    sparse member (whose holes would let a small archive fill a disk; without them, what is
    extracted is at most the archive's own size)."""
    members = tar.getmembers()
    for member in members:
        name = member.name
        plain = member.isfile() and not member.issparse()
        if not plain or "/" in name or "\\" in name or name in ("", ".", ".."):
            raise UnsafeCheckpointError(
                f"{path} is not an ACE3 sharded checkpoint: it holds {name!r}, which is not a "
                "plain file at the top level"
            )
    names = {member.name for member in members}
    if TRAIN_STATE not in names or ".metadata" not in names:
        raise ValueError(
            f"{path} is not an ACE3 sharded checkpoint: it lacks {TRAIN_STATE} or the DCP "
            ".metadata file"
        )
    return members


def read_train_state(path: Path) -> dict[str, Any]:
    """The train state of the sharded checkpoint ``path``, with ``archive`` = its path."""
    with tarfile.open(path, mode="r:") as tar:
        _members(tar, path)
        handle = tar.extractfile(TRAIN_STATE)
        assert handle is not None
        data = handle.read()
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != SHARDED_FORMAT:
        raise ValueError(f"{path}: {TRAIN_STATE} is not an ACE3 sharded train state")
    state["archive"] = str(Path(path).resolve())
    return state


def extract(archive: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=False)
    with tarfile.open(archive, mode="r:") as tar:
        for member in _members(tar, archive):
            source = tar.extractfile(member)
            assert source is not None
            with source, (target / member.name).open("wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)


def _extraction_root(archive: Path) -> Path:
    """Next to the archive when that directory is writable (the job directory: same disk,
    room for it), else the system's temporary directory."""
    return archive.parent if os.access(archive.parent, os.W_OK) else Path(tempfile.gettempdir())


@contextlib.contextmanager
def extracted(archive: Path, ctx: DistContext) -> Iterator[Path]:
    """The archive's DCP directory, extracted once per machine (by local rank 0), removed
    after every rank is done. A collective."""
    token = [uuid.uuid4().hex if ctx.is_main else None]
    if ctx.world_size > 1:
        dist.broadcast_object_list(token, src=0)
    directory = _extraction_root(archive) / f".{archive.name}.restore-{token[0]}"
    failure: BaseException | None = None
    if ctx.local_rank == 0:
        try:
            extract(archive, directory)
        except BaseException as exc:  # every rank must learn of it, not hang at the barrier
            failure = exc
    if _any_rank(failure is not None, ctx):
        if ctx.local_rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
        if failure is not None:
            raise failure
        raise RuntimeError(f"extracting {archive} failed on another machine")
    try:
        yield directory
    finally:
        barrier(ctx)
        if ctx.local_rank == 0:
            shutil.rmtree(directory, ignore_errors=True)


def _any_rank(flag: bool, ctx: DistContext) -> bool:
    if ctx.world_size == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=ctx.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)
