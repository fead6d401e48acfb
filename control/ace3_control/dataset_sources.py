"""Where registered datasets may come from, the client the service reads them with, and the
listing of a registered prefix into a :class:`~ace3.config.shards.ShardManifest`.

``ACE3_DATASET_SOURCES`` lists the bucket prefixes an administrator allowed; the API lists
objects under them when a dataset is registered and a worker fetches shards from them, both
with the service's own S3 settings (``ACE3_S3_ENDPOINT_URL``, ``AWS_*``), used for sources also
when the artifact store is local. No job ever gets these credentials. The artifact store's own
bucket and prefix (``ACE3_STORAGE_URL``) are never a source, whatever the list says: a dataset
over them would let one owner read another's stored files.
"""

from __future__ import annotations

import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ace3.config.shards import SHARD_SUFFIXES, Shard, ShardManifest, shard_suffix
from ace3_control.s3_uris import overlaps, parse_sources
from ace3_control.s3_uris import split_s3_uri as split_s3_uri
from ace3_control.storage import parse_storage_url

if TYPE_CHECKING:
    from ace3_control.settings import Settings

#: The most shards one dataset may have (its manifest is one database row).
MAX_SHARDS = 100_000
#: Objects per ListObjectsV2 page (S3's own maximum).
LIST_PAGE_SIZE = 1000
#: Parquet footers read at once, by the whole process (one pool for every request).
FOOTER_READERS = 8
#: Bytes of a parquet file's end read first: the footer of most files is within them.
FOOTER_GUESS_BYTES = 64 * 1024
#: The largest parquet footer read: a real shard's (many row groups and columns) is far less,
#: and a crafted footer length would otherwise have the service read up to 4 GiB.
MAX_FOOTER_BYTES = 16 * 1024 * 1024
#: The most rows one shard may claim (the dataset's sum is checked against BigInteger too).
MAX_ROWS = 2**62
_PARQUET_MAGIC = b"PAR1"
_ITEMSIZE = {"uint16": 2, "uint32": 4}
DEFAULT_COLUMNS = {"inputs": "inputs", "targets": "targets"}


_T = TypeVar("_T")
_R = TypeVar("_R")
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _footer_pool() -> ThreadPoolExecutor:
    """The process's one pool of footer readers (made when first needed)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(FOOTER_READERS, thread_name_prefix="ace3-footer")
        return _pool


def read_footers(
    read: Callable[[_T], _R], items: Iterable[_T], check: Callable[[], None] | None = None
) -> list[_R]:
    """``[read(item) for item in items]``, the reads on the process's footer pool, at most
    :data:`FOOTER_READERS` of this call's at once (so one request never queues all its reads
    before another's); ``check`` runs before each read is submitted (a deadline). The first
    failure is raised and the reads not started yet are not started at all."""
    pool = _footer_pool()
    pending: deque[Future[_R]] = deque()
    results: list[_R] = []
    try:
        for item in items:
            if check is not None:
                check()
            if len(pending) >= FOOTER_READERS:
                results.append(pending.popleft().result())
            pending.append(pool.submit(read, item))
        while pending:
            results.append(pending.popleft().result())
    finally:
        for future in pending:
            future.cancel()
    return results


class SourceProblem(ValueError):
    """A dataset that cannot be registered: ``field`` is the request field to name (``uri``,
    ``columns``) and the message says why."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def allowed_sources(settings: Settings) -> list[tuple[str, str]]:
    """The allowed (bucket, prefix) pairs of ``ACE3_DATASET_SOURCES``; empty when unset."""
    return parse_sources(settings.dataset_sources)


def store_location(settings: Settings) -> tuple[str, str] | None:
    """The artifact store's (bucket, prefix) when it is S3, else None."""
    if not settings.storage_url:
        return None
    bucket, prefix = parse_storage_url(settings.storage_url)
    return bucket, f"{prefix}/" if prefix else ""


def check_source(settings: Settings, uri: str) -> tuple[str, str]:
    """``uri``'s (bucket, prefix) if a dataset may be registered from it: under an allowed
    source (same bucket, prefix starting with the allowed one) and not overlapping the
    artifact store's own bucket and prefix. Raises :class:`SourceProblem` naming ``uri``."""
    try:
        location = split_s3_uri(uri)
    except ValueError as exc:
        raise SourceProblem("uri", str(exc)) from None
    store = store_location(settings)
    if store is not None and overlaps(store, location, casefold=True):
        raise SourceProblem(
            "uri",
            f"{uri} is (or holds) the service's own artifact store (s3://{store[0]}/{store[1]}): "
            "it is never a dataset source; put the shards under another prefix",
        )
    allowed = allowed_sources(settings)
    if not any(
        location[0] == bucket and location[1].startswith(prefix) for bucket, prefix in allowed
    ):
        listed = ", ".join(f"s3://{bucket}/{prefix}" for bucket, prefix in allowed)
        where = f"the allowed sources are {listed}" if listed else "no source is allowed"
        raise SourceProblem(
            "uri",
            f"{uri} is not under a dataset source this service may read ({where}): an "
            "administrator allows prefixes with ACE3_DATASET_SOURCES",
        )
    return location


class Deadline:
    """The wall-clock limit of one registration's listing and footer reads."""

    def __init__(self, uri: str, seconds: float) -> None:
        self.uri = uri
        self.seconds = seconds
        self.ends = time.monotonic() + seconds

    def check(self) -> None:
        """Raises :class:`SourceProblem` naming ``uri`` once the time is up."""
        if time.monotonic() > self.ends:
            raise SourceProblem(
                "uri",
                f"listing {self.uri} took longer than {self.seconds:g} seconds (the most one "
                "registration may take, ACE3_DATASET_LISTING_SECONDS): register a narrower "
                "prefix, or fewer, larger shards",
            )


def _unreachable(uri: str, exc: Exception) -> SourceProblem:
    return SourceProblem("uri", f"{uri} cannot be read by the service: {exc}")


def list_shards(
    client: Any,
    uri: str,
    format: str,
    *,
    page_size: int = LIST_PAGE_SIZE,
    max_shards: int = MAX_SHARDS,
    max_examined: int | None = None,
    deadline: Deadline | None = None,
) -> list[Shard]:
    """The objects under ``uri`` with one of ``format``'s endings, sorted by name (their keys
    relative to the prefix), each with its size and unquoted ETag; paginated ListObjectsV2.
    Raises :class:`SourceProblem` naming ``uri`` when the source cannot be read, holds none,
    holds more than ``max_shards``, a key is not a usable shard name, more than
    ``max_examined`` objects (default 10 x ``max_shards``) were listed or ``deadline`` passed."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split_s3_uri(uri)
    examine = max_examined if max_examined is not None else 10 * max_shards
    shards: list[Shard] = []
    examined = 0
    request: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
    while True:
        if deadline is not None:
            deadline.check()
        try:
            page = client.list_objects_v2(**request)
        except (BotoCoreError, ClientError) as exc:
            raise _unreachable(uri, exc) from None
        for item in page.get("Contents") or []:
            examined += 1
            if examined > examine:
                raise SourceProblem(
                    "uri",
                    f"{uri} holds more than {examine} objects (the most one registration "
                    "examines): register a narrower prefix holding the shards only",
                )
            name = str(item["Key"])[len(prefix) :]
            if shard_suffix(format, name) is None:
                continue
            if len(shards) >= max_shards:
                raise SourceProblem(
                    "uri",
                    f"{uri} holds more than {max_shards} {format} shards (the most one dataset "
                    "may have): register a narrower prefix, or pack the data into fewer, "
                    "larger shards",
                )
            try:
                shard = Shard(name=name, size=int(item["Size"]), etag=str(item["ETag"]).strip('"'))
            except ValueError as exc:
                raise SourceProblem("uri", f"{uri}: object {name!r} is not usable: {exc}") from None
            shards.append(shard)
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            break
        request["ContinuationToken"] = token
    if not shards:
        endings = ", ".join(SHARD_SUFFIXES[format])
        raise SourceProblem("uri", f"{uri} holds no {format} shards (objects ending in {endings})")
    return sorted(shards, key=lambda shard: shard.name)


def _ranged(client: Any, bucket: str, key: str, first: int, last: int) -> bytes:
    response = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={first}-{last}")
    body: bytes = response["Body"].read()
    return body


def parquet_footer(client: Any, bucket: str, key: str, size: int) -> tuple[int, list[str]]:
    """(rows, top-level column names) of the parquet object ``key`` of ``size`` bytes, from its
    footer alone (one ranged GET, two when the footer is larger than the first guess; never
    more than :data:`MAX_FOOTER_BYTES`). Raises ``ValueError`` when it is not a parquet file,
    its footer is larger than that, or it claims a row count outside 0 to :data:`MAX_ROWS`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if size < 12:
        raise ValueError(f"{size} bytes is too short for a parquet file")
    first = max(0, size - FOOTER_GUESS_BYTES)
    tail = _ranged(client, bucket, key, first, size - 1)
    if len(tail) != size - first or tail[-4:] != _PARQUET_MAGIC:
        raise ValueError("it does not end in the parquet magic bytes (PAR1)")
    (length,) = struct.unpack("<I", tail[-8:-4])
    if length + 8 > size - 4:
        raise ValueError(f"its footer length ({length}) is past the file's start")
    if length > MAX_FOOTER_BYTES:
        raise ValueError(
            f"its footer is {length} bytes, more than the {MAX_FOOTER_BYTES} bytes the service "
            "reads (write fewer row groups per file)"
        )
    if length + 8 > len(tail):
        tail = _ranged(client, bucket, key, size - length - 8, size - 1)
        if len(tail) != length + 8:
            raise ValueError("its footer could not be read whole")
    try:  # (a view of the footer, not a copy)
        footer = pa.py_buffer(tail).slice(len(tail) - length - 8)
        metadata = pq.read_metadata(pa.BufferReader(footer))
        names = list(metadata.schema.to_arrow_schema().names)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"its footer cannot be read: {exc}") from None
    rows = int(metadata.num_rows)
    if not 0 <= rows <= MAX_ROWS:
        raise ValueError(f"its footer claims {rows} rows (a shard has 0 to {MAX_ROWS})")
    return rows, names


def _count_parquet_rows(
    client: Any,
    uri: str,
    shards: list[Shard],
    columns: dict[str, str],
    deadline: Deadline | None = None,
) -> list[Shard]:
    """``shards`` with their row counts, read from the footers on the process's footer pool;
    every shard must have the columns read as inputs and targets."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = split_s3_uri(uri)

    def footer(shard: Shard) -> tuple[int, list[str]]:
        try:
            return parquet_footer(client, bucket, prefix + shard.name, shard.size)
        except (BotoCoreError, ClientError) as exc:
            raise _unreachable(uri, exc) from None
        except ValueError as exc:
            raise SourceProblem("uri", f"{uri}: shard {shard.name} is not parquet: {exc}") from None

    footers = read_footers(footer, shards, deadline.check if deadline is not None else None)
    counted = []
    for shard, (rows, names) in zip(shards, footers, strict=True):
        missing = [column for column in columns.values() if column not in names]
        if missing:
            raise SourceProblem(
                "columns",
                f"shard {shard.name} has no column {missing[0]!r} (its columns: "
                f"{', '.join(names[:20]) or 'none'}): name the inputs and targets columns with "
                "columns={'inputs': ..., 'targets': ...}",
            )
        counted.append(Shard(name=shard.name, size=shard.size, etag=shard.etag, samples=rows))
    return counted


def _check_tokens(uri: str, shards: list[Shard], dtype: str) -> None:
    itemsize = _ITEMSIZE[dtype]
    for shard in shards:
        if shard.size % itemsize:
            raise SourceProblem(
                "uri",
                f"{uri}: shard {shard.name} has {shard.size} bytes, not a whole number of "
                f"{dtype} token ids ({itemsize} bytes each): is the dtype right?",
            )


def list_manifest(
    client: Any,
    uri: str,
    format: str,
    *,
    dtype: str | None = None,
    columns: dict[str, str] | None = None,
    page_size: int | None = None,
    max_shards: int | None = None,
    listing_seconds: float | None = None,
) -> ShardManifest:
    """The manifest of the ``format`` shards under ``uri`` (an allowed source: see
    :func:`check_source`): parquet shards with their row counts and checked columns, token
    files checked against ``dtype`` (default uint16). The uri is kept normalized
    (``s3://bucket/prefix/``), so the same listing always has the same digest. ``page_size``
    and ``max_shards`` default to :data:`LIST_PAGE_SIZE` and :data:`MAX_SHARDS` (read at the
    call); the listing and the footer reads together take at most ``listing_seconds``
    (default no limit). Raises :class:`SourceProblem`."""
    bucket, prefix = split_s3_uri(uri)
    uri = f"s3://{bucket}/{prefix}"
    deadline = Deadline(uri, listing_seconds) if listing_seconds is not None else None
    shards = list_shards(
        client,
        uri,
        format,
        page_size=page_size or LIST_PAGE_SIZE,
        max_shards=max_shards or MAX_SHARDS,
        deadline=deadline,
    )
    mapping: dict[str, str] | None = None
    if format == "parquet":
        mapping = {**DEFAULT_COLUMNS, **(columns or {})}
        shards = _count_parquet_rows(client, uri, shards, mapping, deadline)
        if mapping == DEFAULT_COLUMNS:
            mapping = None
    if format == "tokens":
        dtype = dtype or "uint16"
        _check_tokens(uri, shards, dtype)
    return ShardManifest.model_validate(
        {
            "uri": uri,
            "format": format,
            "dtype": dtype if format == "tokens" else None,
            "columns": mapping,
            "shards": shards,
        }
    )
