"""One way to send a stored file to a client: its bytes, length, name and sha256, streamed out
of the store, or a 307 to a presigned URL of the object store (``ACE3_S3_PRESIGNED_DOWNLOADS``).
"""

from __future__ import annotations

from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ace3_control.settings import Settings
from ace3_control.storage import ArtifactStore
from ace3_control.storage.base import iter_handle


async def presigned_redirect(
    store: ArtifactStore, settings: Settings, storage_key: str, disposition: str, sha256: str
) -> RedirectResponse | None:
    """A 307 to the object's presigned URL when configured and the store has such URLs."""
    if not settings.s3_presigned_downloads:
        return None
    url = await run_in_threadpool(store.presigned_url, storage_key, disposition)
    if url is None:
        return None
    return RedirectResponse(url, status_code=307, headers={"x-checksum-sha256": sha256})


async def stored_file_response(
    store: ArtifactStore,
    settings: Settings,
    storage_key: str,
    size_bytes: int,
    name: str,
    sha256: str,
) -> Response:
    """The stored bytes under ``storage_key`` as an attachment named ``name`` (a name the
    server chose or checked), with ``x-checksum-sha256`` for the client to verify."""
    disposition = f'attachment; filename="{name}"'
    redirect = await presigned_redirect(store, settings, storage_key, disposition, sha256)
    if redirect is not None:
        return redirect
    handle = await run_in_threadpool(store.open, storage_key)
    return StreamingResponse(
        iter_handle(handle),
        media_type="application/octet-stream",
        headers={
            "content-length": str(size_bytes),
            "content-disposition": disposition,
            "x-checksum-sha256": sha256,
        },
    )
