"""Receiving uploads: stream to a staging file with a size cap, hashing as the bytes arrive."""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from starlette.concurrency import run_in_threadpool

from ace3_server.errors import payload_too_large

CHUNK_BYTES = 1 << 20


@dataclass
class StagedUpload:
    path: Path
    sha256: str
    size_bytes: int

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def _copy_capped(source: BinaryIO, staging_dir: Path, max_bytes: int) -> StagedUpload:
    digest = hashlib.sha256()
    size = 0
    fd, name = tempfile.mkstemp(dir=staging_dir, prefix="upload-")
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in iter(lambda: source.read(CHUNK_BYTES), b""):
                size += len(chunk)
                if size > max_bytes:
                    raise payload_too_large(max_bytes)
                digest.update(chunk)
                handle.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return StagedUpload(path=path, sha256=digest.hexdigest(), size_bytes=size)


async def stage_upload(source: BinaryIO, staging_dir: Path, max_bytes: int) -> StagedUpload:
    return await run_in_threadpool(_copy_capped, source, staging_dir, max_bytes)
