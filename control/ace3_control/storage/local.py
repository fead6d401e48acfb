"""The embedded default store: objects as files under one root directory (a shared volume when
the API and the workers run on one machine), trees as directories.

Writes are atomic (temporary file, fsync, rename) so a reader never sees half a file.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ace3.files import atomic_path, fsync_directory
from ace3_control.storage.base import (
    TREE_NAME,
    KeyFor,
    Readable,
    StoredBlob,
    check_key,
    check_prefix,
    check_tree_key,
    copy_verified,
    iter_handle,
    spool,
    verify_digest,
)
from ace3_control.storage.trees import verify_tree

_STAGING = ".staging"


class LocalArtifactStore:
    """Artifacts as files under one root directory."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        check_key(key)
        if key.split("/", 1)[0] == _STAGING:
            raise ValueError(f"invalid storage key {key!r}")
        return self.root / key

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def size(self, key: str) -> int:
        path = self._path(key)
        if path.is_dir():
            return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return path.stat().st_size

    def staging_dir(self) -> Path:
        staging = self.root / _STAGING
        staging.mkdir(parents=True, exist_ok=True)
        return staging

    def put_file(self, key: str, source: Path) -> None:
        """Copy the file ``source`` to ``key`` atomically; a directory (a tree) is moved there
        (and consumed: when ``key`` holds it already, ``source`` is removed)."""
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            check_tree_key(key)
            if target.exists():
                shutil.rmtree(source)
                return
            os.replace(source, target)
            fsync_directory(target.parent)
            return
        with atomic_path(target, mode=0o600) as tmp:  # (the store's files are its own)
            shutil.copyfile(source, tmp)

    def _commit(self, spooled_path: Path, key: str) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(spooled_path, target)
        fsync_directory(target.parent)

    def put_stream(
        self, key: str, source: BinaryIO, *, max_bytes: int | None = None, sha256: str | None = None
    ) -> StoredBlob:
        """Store ``source`` under ``key`` (replacing it); refused past ``max_bytes``
        (:class:`StoredTooLargeError`) or when its sha256 is not ``sha256``
        (:class:`StoredDigestError`), and then nothing changes."""
        self._path(key)
        spooled = spool(source, self.staging_dir(), max_bytes)
        verify_digest(spooled, sha256, key)
        try:
            self._commit(spooled.path, key)
        finally:
            spooled.path.unlink(missing_ok=True)
        return StoredBlob(key, spooled.sha256, spooled.size_bytes)

    def put_hashed(
        self, source: Readable, key_for: KeyFor, *, max_bytes: int | None = None
    ) -> StoredBlob:
        """Copy ``source`` into the store, hashing the bytes as they are copied, under the key
        ``key_for(sha256)``. The key must hold the hash (content addressing): when it exists
        already, the stored bytes are the same and are kept as they are."""
        spooled = spool(source, self.staging_dir(), max_bytes)
        try:
            key = key_for(spooled.sha256)
            if not self._path(key).exists():
                self._commit(spooled.path, key)
        finally:
            spooled.path.unlink(missing_ok=True)
        return StoredBlob(key, spooled.sha256, spooled.size_bytes)

    def open(self, key: str) -> BinaryIO:
        """The object's bytes (FileNotFoundError when there is none)."""
        return self._path(key).open("rb")

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        return iter_handle(self.open(key))

    def fetch(self, key: str, target: Path, sha256: str | None = None) -> Path:
        """Copy the object or the tree (links as links) to the new path ``target``, verified
        against ``sha256`` (a tree's: its :func:`~ace3_control.storage.trees.tree_digest`; on
        a mismatch nothing is left at ``target``); FileNotFoundError when the key holds
        nothing."""
        source = self._path(key)
        if source.is_dir():
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copytree(source, target, symlinks=True)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            verify_tree(target, sha256, key)
        elif source.is_file():
            with source.open("rb") as handle:
                copy_verified(handle, target, sha256, key)
        else:
            raise FileNotFoundError(f"{key} is missing from the artifact store")
        return target

    def delete(self, key: str) -> None:
        target = self._path(key)
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)

    def list(self, prefix: str) -> list[str]:
        """Every key under ``prefix`` (string prefix, as S3 lists), sorted; a tree is one key."""
        check_prefix(prefix)
        head, _, _ = prefix.rpartition("/")
        start = self.root / head if head else self.root
        found: list[str] = []
        if not start.is_dir():
            return found
        for directory, subdirectories, names in os.walk(start):
            relative = Path(directory).relative_to(self.root).as_posix()
            base = "" if relative == "." else f"{relative}/"
            if not base:
                subdirectories[:] = [d for d in subdirectories if d != _STAGING]
            for name in names:
                if (base + name).startswith(prefix):
                    found.append(base + name)
            for name in [d for d in subdirectories if d == TREE_NAME]:
                subdirectories.remove(name)
                if (base + name).startswith(prefix):
                    found.append(base + name)
        return sorted(found)

    def presigned_url(
        self, key: str, content_disposition: str, expires_seconds: int = 300
    ) -> str | None:
        """None: the API streams local files itself."""
        return None
