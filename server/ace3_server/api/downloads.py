"""One way to stream a stored file to a client: its bytes, length, name and sha256."""

from __future__ import annotations

from fastapi.responses import StreamingResponse

from ace3_control.storage import LocalArtifactStore


def stored_file_response(
    store: LocalArtifactStore, storage_key: str, size_bytes: int, name: str, sha256: str
) -> StreamingResponse:
    """The stored bytes under ``storage_key`` as an attachment named ``name`` (a name the
    server chose or checked), with ``x-checksum-sha256`` for the client to verify."""
    return StreamingResponse(
        store.iter_bytes(storage_key),
        media_type="application/octet-stream",
        headers={
            "content-length": str(size_bytes),
            "content-disposition": f'attachment; filename="{name}"',
            "x-checksum-sha256": sha256,
        },
    )
