"""Downloads of stored files (checkpoints of ``client.jobs`` and ``client.checkpoints``,
artifacts): streamed into place through a temporary file, checked against the server's sha256."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ace3.errors import ChecksumMismatchError
from ace3.files import atomic_path

if TYPE_CHECKING:
    from ace3.client._http import HTTPClient

FILENAME = re.compile(r'filename="?([^";]+)"?')


def write_verified(response: Any, target: Path, expected: str | None, *, verify: bool) -> str:
    """Stream ``response`` into ``target`` through a temporary file in the same directory,
    renamed into place only when complete and (with ``verify``) matching both the server's
    ``x-checksum-sha256`` and ``expected``; return the sha256 of the bytes."""
    announced = response.headers.get("x-checksum-sha256")
    digest = hashlib.sha256()
    with atomic_path(target) as partial, partial.open("wb") as handle:
        for chunk in response.iter_bytes():
            digest.update(chunk)
            handle.write(chunk)
        handle.flush()
        actual = digest.hexdigest()
        if verify:
            for wanted in (announced, expected):
                if wanted and wanted.lower() != actual:
                    raise ChecksumMismatchError(str(target), wanted.lower(), actual)
    return actual


def download_checkpoint_file(
    http: HTTPClient,
    path: str,
    to: Path,
    *,
    checkpoint_id: str,
    name: str | None,
    expected: str | None,
    verify: bool,
) -> Path:
    """``GET path`` (a checkpoint's content) into ``to``: a file path, or an existing directory
    to put it in under ``name``, else the server's file name, else ``<checkpoint_id>.pt``."""
    target = to
    with http.stream("GET", path) as response:
        if target.is_dir():
            if not name:
                match = FILENAME.search(response.headers.get("content-disposition", ""))
                name = Path(match.group(1)).name if match else f"{checkpoint_id}.pt"
            target = target / name
        write_verified(response, target, expected, verify=verify)
    return target
