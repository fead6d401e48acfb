"""Reading a job's artifacts (the files it wrote under ``output/artifacts/``, synced by the
worker): listing them and opening one version's bytes for download.

Paths are looked up as stored, never joined onto a filesystem path, so a request path cannot
reach anything but a recorded artifact; malformed ones (absolute, ``..``, empty segments) are
refused with 400 before any lookup.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO
from urllib.parse import quote

from fastapi import HTTPException
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.concurrency import run_in_threadpool

from ace3.config.specs import ARTIFACT_SCHEME
from ace3.files import CHUNK_BYTES
from ace3_control.models import JobArtifact
from ace3_control.storage import ArtifactStore
from ace3_server.errors import not_found

MAX_PATH_CHARS = 1024


def check_artifact_path(path: str, *, what: str = "artifact path") -> str:
    """``path`` as stored (relative, '/'-separated), or 400 naming what is wrong with it."""
    problem = None
    if not path:
        problem = "is empty"
    elif len(path) > MAX_PATH_CHARS:
        problem = f"is longer than {MAX_PATH_CHARS} characters"
    elif path.startswith("/"):
        problem = "is absolute"
    elif any(part in ("", ".", "..") for part in path.split("/")):
        problem = "has an empty, '.' or '..' segment"
    elif any(ord(char) < 32 or ord(char) == 127 for char in path):
        problem = "has a control character"
    if problem is not None:
        raise HTTPException(
            status_code=400,
            detail=f"{what} {path[:200]!r} {problem}: use a path relative to the job's artifacts "
            "directory, as GET /v1/jobs/{id}/artifacts lists it",
        )
    return path


async def list_artifacts(
    session: AsyncSession, job_id: str, prefix: str | None
) -> list[JobArtifact]:
    stmt = select(JobArtifact).where(JobArtifact.job_id == job_id)
    if prefix:
        stripped = prefix.removeprefix(ARTIFACT_SCHEME).strip("/")
        check_artifact_path(stripped, what="prefix")
        # The prefix names a directory (or a file): "tb" matches "tb" and "tb/...", not "tb2".
        stmt = stmt.where(
            (JobArtifact.path == stripped)
            | (JobArtifact.path.startswith(stripped + "/", autoescape=True))
        )
    return list((await session.scalars(stmt.order_by(JobArtifact.path))).all())


async def _find(session: AsyncSession, job_id: str, path: str) -> JobArtifact | None:
    return await session.scalar(
        select(JobArtifact)
        .where(JobArtifact.job_id == job_id, JobArtifact.path == path)
        .execution_options(populate_existing=True)
    )


async def open_artifact(
    session: AsyncSession, store: ArtifactStore, job_id: str, path: str
) -> tuple[JobArtifact, BinaryIO]:
    """The artifact's newest row and its bytes, opened before the response starts.

    The worker deletes a replaced version's bytes once the new row is committed: if they vanish
    between reading the row and opening them, the row is read again (it names the new bytes).
    An open handle keeps reading its version even when it is deleted meanwhile.
    """
    check_artifact_path(path)
    for _ in range(3):
        row = await _find(session, job_id, path)
        if row is None:
            break
        try:
            return row, await run_in_threadpool(store.open, row.storage_key)
        except FileNotFoundError:
            continue
    raise not_found("artifact")


async def find_artifact(session: AsyncSession, job_id: str, path: str) -> JobArtifact:
    """The artifact's newest row (404 when the job has none at ``path``)."""
    check_artifact_path(path)
    row = await _find(session, job_id, path)
    if row is None:
        raise not_found("artifact")
    return row


def content_disposition(path: str) -> str:
    """An attachment named after the file (RFC 6266: an ASCII fallback, then the UTF-8 name)."""
    name = path.rsplit("/", 1)[-1]
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def iter_handle(handle: BinaryIO) -> Iterator[bytes]:
    """Stream an open file and close it at the end (or when the client goes away)."""
    with handle:
        yield from iter(lambda: handle.read(CHUNK_BYTES), b"")
