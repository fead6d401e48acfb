"""Fetching one shard into the node cache (:mod:`ace3_worker.shard_cache`), verified against the
dataset's manifest, from one of two sources:

- :class:`S3ShardSource`, a dataset registered from a bucket (kind "remote"): the object is read
  with the service's own S3 settings (:func:`ace3_control.source_client.source_client`; no job
  ever gets them), ``If-Match`` the registered ETag (a 412: it changed). Its ETag (unquoted,
  compared as an opaque string: a multipart upload's is no MD5) and its size must be what the
  manifest recorded when the dataset was registered.
- :class:`StoreShardSource`, an uploaded shard directory (kind "shards"): the artifact store's
  object ``manifest.uri + shard.etag`` (``datasets/<owner>/shards/<sha256>``), whose bytes must
  hash to that sha256 and be ``shard.size`` long (the store's own ETag is not looked at: on S3
  it is a copy's).

Otherwise, or when the object is gone, the shard changed (:class:`ShardChangedError`) and the job
fails naming it, before any of its bytes reach the job. The bytes are hashed (sha256) while they
are written into the entry's reserved part file, which is renamed into place only when every
byte arrived (and, for a source that knows their sha256, only when it matches); it is not
fsynced where the cache is tagged with this boot (:mod:`ace3_worker.shard_cache_boot`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ace3.config.shards import Shard
from ace3_control.dataset_sources import split_s3_uri
from ace3_control.storage import ArtifactStore
from ace3_worker import shard_ranges
from ace3_worker.shard_cache import CachedShard, ShardCache

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class ShardChangedError(RuntimeError):
    """The shard's object is not what the manifest recorded (or is gone): the job cannot read
    the dataset it was given."""


class FetchStopped(RuntimeError):
    """The feed stopped (the attempt ended) while the shard was fetched."""


@dataclass
class ShardObject:
    """An object being read: what the source says it is (None: it does not say), and its bytes;
    ``sha256``: what the bytes must hash to, when the source knows it (content-addressed)."""

    etag: str | None
    size: int | None
    chunks: Iterator[bytes]
    close: Callable[[], None]
    sha256: str | None = None


class ShardSource(Protocol):
    """Where a dataset's shards are read from."""

    uri: str

    def open(self, shard: Shard) -> ShardObject:
        """The shard's object; raises :class:`ShardChangedError` when it is gone."""


class S3ShardSource:
    """The shards of a registered dataset: objects under ``s3://bucket/prefix/``."""

    def __init__(self, uri: str, client: Any) -> None:
        self.uri = uri
        self.bucket, self.prefix = split_s3_uri(uri)
        self.client = client

    def _get(self, shard: Shard, **extra: str) -> Any:
        """GetObject of the shard, If-Match its registered ETag (the object read is the one
        registered, not one replaced meanwhile); a 404 or a 412 is :class:`ShardChangedError`."""
        from botocore.exceptions import ClientError

        key = f"{self.prefix}{shard.name}"
        try:
            return self.client.get_object(
                Bucket=self.bucket, Key=key, IfMatch=f'"{shard.etag}"', **extra
            )
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound"):
                raise ShardChangedError(
                    f"dataset shard {shard.name!r} is gone from {self.uri} (deleted since the "
                    "dataset was registered)"
                ) from exc
            if code in ("PreconditionFailed", "412"):
                raise ShardChangedError(
                    f"dataset shard {shard.name!r} ({self.uri}) changed since the dataset was "
                    f"registered: its ETag is no longer {shard.etag!r}; register the dataset "
                    "again to train on what it holds now"
                ) from exc
            raise

    def open(self, shard: Shard) -> ShardObject:
        response = self._get(shard)
        body = response["Body"]
        return ShardObject(
            etag=str(response.get("ETag", "")).strip('"'),
            size=int(response.get("ContentLength", -1)),
            chunks=body.iter_chunks(CHUNK_BYTES),
            close=body.close,
        )

    def open_range(self, shard: Shard, first: int, last: int) -> shard_ranges.Part:
        """A stream of bytes ``first`` to ``last`` (inclusive) of the shard (a large one is
        fetched in ranges: :mod:`ace3_worker.shard_ranges`), checked as :meth:`open`'s object
        is: the registered ETag, the object's total size; and the part's own length."""
        response = self._get(shard, Range=f"bytes={first}-{last}")
        body = response["Body"]
        try:
            found = _CONTENT_RANGE.match(str(response.get("ContentRange", "")))
            total = int(found[3]) if found else -1
            etag = str(response.get("ETag", "")).strip('"')
            check_object(shard, self.uri, ShardObject(etag, total, iter(()), body.close))
            if found is None or (int(found[1]), int(found[2])) != (first, last):
                raise OSError(
                    f"shard {shard.name!r}: asked for bytes {first}-{last}, the source answered "
                    f"{response.get('ContentRange')!r}"
                )
            length = int(response.get("ContentLength", -1))
            if length != last - first + 1:
                raise OSError(f"shard {shard.name!r}: bytes {first}-{last} came as {length} bytes")
        except BaseException:
            body.close()
            raise
        return BodyPart(body, length)


class BodyPart:
    """A ranged GET's body read straight into the caller's buffers: through the HTTP
    response under botocore's (``http.client``'s ``readinto``, no bytes object per read) where
    it is one, else through the body's ``read``. The connection goes back to the client's
    pool once every byte was read, and is closed with a part left unread."""

    def __init__(self, body: Any, length: int) -> None:
        self.body, self.left = body, length
        raw = getattr(body, "_raw_stream", None)  # (urllib3's response)
        inner = getattr(raw, "_fp", None)  # (http.client's, under it)
        self._release = getattr(raw, "release_conn", None)
        self._readinto = getattr(inner, "readinto", None)

    def readinto(self, buffer: memoryview, /) -> int:
        view = buffer[: self.left]
        if self._readinto is not None:
            count = int(self._readinto(view))
        else:
            data = self.body.read(len(view))
            count = len(data)
            view[:count] = data
        self.left -= count
        release = self._release
        if not self.left and release is not None:
            self._release = None
            release()
        return count

    def close(self) -> None:
        self.body.close()


class StoreShardSource:
    """The shards of an uploaded shard directory: the artifact store's objects ``uri + sha256``
    (``uri`` is the owner's shard prefix, ``datasets/<owner>/shards/``)."""

    def __init__(self, uri: str, store: ArtifactStore) -> None:
        self.uri = uri
        self.store = store

    def open(self, shard: Shard) -> ShardObject:
        if not SHA256_HEX.fullmatch(shard.etag):
            raise ShardChangedError(
                f"dataset shard {shard.name!r} has no sha256 in its manifest ({shard.etag!r})"
            )
        key = f"{self.uri}{shard.etag}"
        try:
            handle = self.store.open(key)
        except FileNotFoundError as exc:
            raise ShardChangedError(
                f"dataset shard {shard.name!r} is gone from the artifact store ({key}): the "
                "store lost it since it was uploaded"
            ) from exc
        return ShardObject(
            etag=None,
            size=None,
            chunks=iter(lambda: handle.read(CHUNK_BYTES), b""),
            close=handle.close,
            sha256=shard.etag,
        )


def check_object(shard: Shard, uri: str, found: ShardObject) -> None:
    """Raise :class:`ShardChangedError`, naming the shard and what changed, unless the object is
    the one the manifest recorded (as far as the source says before its bytes are read)."""
    changes = []
    if found.etag is not None and found.etag != shard.etag:
        changes.append(f"its ETag is {found.etag!r}, registered {shard.etag!r}")
    if found.size is not None and found.size != shard.size:
        changes.append(f"its size is {found.size} bytes, registered {shard.size}")
    if changes:
        raise ShardChangedError(
            f"dataset shard {shard.name!r} ({uri}) changed since the dataset was registered: "
            f"{'; '.join(changes)}; register the dataset again to train on what it holds now"
        )


@dataclass(frozen=True)
class Obtained:
    """A shard present in the cache, and whether this call fetched it."""

    cached: CachedShard
    fetched: bool


def obtain(
    cache: ShardCache,
    source: ShardSource,
    digest: str,
    file: str,
    shard: Shard,
    *,
    stop: threading.Event,
    wait: bool,
    waiting: Callable[[float, int], None] | None = None,
    wait_seconds: float | None = None,
) -> Obtained | None:
    """The shard in the cache: already there, or fetched now (once per node: whoever holds the
    entry's lock fetches, the others find it done). None when there is no room yet and not
    ``wait``; raises :class:`FetchStopped` when ``stop`` is set meanwhile,
    :class:`ShardChangedError` or :class:`~ace3_worker.shard_cache.CacheTooSmallError` when it
    can never be had, anything else when this fetch failed (another may work)."""
    found = cache.lookup(digest, file)
    if found is not None:
        return Obtained(found, fetched=False)
    with cache.locked(digest, file, stop=stop) as held:
        if not held:
            raise FetchStopped(file)
        found = cache.lookup(digest, file)
        if found is not None:
            return Obtained(found, fetched=False)
        cache.discard(digest, file)  # (a damaged entry: a shard without its sidecar)
        reservation = cache.reserve(
            digest,
            file,
            shard.size,
            stop=stop,
            wait=wait,
            waiting=waiting,
            wait_seconds=wait_seconds,
        )
        if reservation is None:
            if stop.is_set():
                raise FetchStopped(file)
            return None
        try:
            sha256 = _copy(source, shard, reservation.fd, stop, flush=not cache.unsynced)
            record = {"name": shard.name, "size": shard.size, "etag": shard.etag, "uri": source.uri}
            path = cache.commit(reservation, sha256, record)
        except BaseException:
            cache.abandon(reservation)
            raise
    return Obtained(CachedShard(path, sha256), fetched=True)


def check_content(shard: Shard, uri: str, sha256: str, size: int) -> None:
    """Raise :class:`ShardChangedError`, naming the shard, unless the bytes read from a
    content-addressed source are the ones uploaded. ``size``: the bytes read (the reading stops
    in the first chunk past the manifest's size), ``sha256``: theirs."""
    if size > shard.size:
        change = f"it holds more than the {shard.size} bytes uploaded"
    elif size < shard.size:
        change = f"it holds {size} bytes, uploaded {shard.size}"
    elif sha256 != shard.etag:
        change = f"its sha256 is {sha256}, uploaded {shard.etag}"
    else:
        return
    raise ShardChangedError(
        f"dataset shard {shard.name!r} ({uri}{shard.etag}) is not what was uploaded: {change}; "
        "the artifact store is corrupted"
    )


def _copy(source: ShardSource, shard: Shard, fd: int, stop: threading.Event, *, flush: bool) -> str:
    """The shard's bytes into ``fd``, checked against the manifest; their sha256. A large
    shard of a bucket is read as parallel ranges, a smaller one read ahead by a thread
    (:mod:`ace3_worker.shard_ranges`); ``flush``: the entry will be fsynced (flush while
    the bytes arrive)."""
    if isinstance(source, S3ShardSource) and shard.size >= shard_ranges.RANGED_MIN_BYTES:
        return shard_ranges.copy_ranges(
            functools.partial(source.open_range, shard), shard, fd, stop,
            stopped=lambda: FetchStopped(shard.name), flush=flush,
        )  # fmt: skip
    found = source.open(shard)
    closed = threading.Event()
    try:
        check_object(shard, source.uri, found)
        digest = hashlib.sha256()
        written = 0
        for chunk in shard_ranges.read_ahead(found.chunks, closed):
            if stop.is_set():
                raise FetchStopped(shard.name)
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            written += len(chunk)
            if written > shard.size:
                break
    finally:
        closed.set()
        found.close()
    if found.sha256 is not None:
        check_content(shard, source.uri, digest.hexdigest(), written)
    if written != shard.size:
        raise OSError(f"shard {shard.name!r}: {written} bytes arrived of {shard.size}")
    return digest.hexdigest()
