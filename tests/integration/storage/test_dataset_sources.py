"""Dataset sources: which s3:// URIs may be registered (ACE3_DATASET_SOURCES, never the artifact
store's own bucket and prefix), and the listing of one into a shard manifest on a real S3
server (the session's SeaweedFS): paginated, each format's endings, parquet row counts from
the footers, token files checked against their dtype, the shard cap; the bounds on what one
registration reads (objects examined, its deadline, footer bytes, row counts), and the footer
reads of every request on one pool."""

from __future__ import annotations

import io
import secrets
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

from ace3_control.dataset_sources import (
    SourceProblem,
    check_source,
    list_manifest,
    parquet_footer,
)
from ace3_control.settings import Settings
from ace3_control.source_client import source_client
from tests.object_store import ObjectStore
from tests.shard_sources import (
    jsonl_bytes,
    new_bucket,
    parquet_bytes,
    put,
    s3_client,
    source_credentials,
    tar_bytes,
    tokens_bytes,
)


def negative_rows(data: bytes) -> bytes:
    """Parquet ``data`` of 5 rows whose footer claims -5 (the varint 10 of num_rows made 9)."""
    (length,) = struct.unpack("<I", data[-8:-4])
    start = len(data) - 8 - length
    at = data.index(b"\x16\x0a", start)  # (FileMetaData field 3, i64, zigzag 5)
    return data[: at + 1] + b"\x09" + data[at + 2 :]


def _settings(tmp_path: Path, sources: str | None, storage_url: str | None = None) -> Settings:
    return Settings(data_dir=tmp_path, dataset_sources=sources, storage_url=storage_url)


def test_a_uri_is_allowed_under_an_allowed_bucket_and_prefix(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "s3://data/team/, s3://open/")
    assert check_source(settings, "s3://data/team/corpus") == ("data", "team/corpus/")
    assert check_source(settings, "s3://data/team/") == ("data", "team/")
    assert check_source(settings, "s3://open") == ("open", "")
    for refused in ("s3://data/", "s3://data/teammate/x/", "s3://other/team/", "s3://opens/x"):
        with pytest.raises(SourceProblem, match="not under a dataset source") as info:
            check_source(settings, refused)
        assert info.value.field == "uri"
        assert "s3://data/team/, s3://open/" in str(info.value)


def test_nothing_is_allowed_without_sources(tmp_path: Path) -> None:
    with pytest.raises(SourceProblem, match="no source is allowed"):
        check_source(_settings(tmp_path, None), "s3://data/x/")


@pytest.mark.parametrize(
    "uri",
    [
        "s3://store/ace3/",
        "s3://store/ace3/datasets/owner/",
        "s3://store/",
        "s3://store",
        "s3://store/ACE3/",  # (the same place to a store that ignores case)
        "s3://Store/Ace3/datasets/",
    ],
)
def test_the_artifact_stores_own_bucket_and_prefix_are_refused_even_when_allowed(
    tmp_path: Path, uri: str
) -> None:
    settings = _settings(tmp_path, "s3://store/", storage_url="s3://store/ace3")
    with pytest.raises(SourceProblem, match="own artifact store") as info:
        check_source(settings, uri)
    assert info.value.field == "uri"
    assert check_source(settings, "s3://store/shards/") == ("store", "shards/")
    assert check_source(settings, "s3://store/ace3x/") == ("store", "ace3x/")


@pytest.mark.parametrize(
    "uri",
    [
        "https://x/y",
        "s3://",
        "s3:///prefix",
        "s3://a/",
        "s3://b/x/../y",
        "s3://b/x y",
        "s3://b/a?x",
    ],
)
def test_what_is_not_a_plain_s3_prefix_is_refused(tmp_path: Path, uri: str) -> None:
    with pytest.raises(SourceProblem) as info:
        check_source(_settings(tmp_path, "s3://bbb/"), uri)
    assert info.value.field == "uri"


@pytest.mark.parametrize("bad", ["http://data/", "s3://data/x,/y", "s3://d/", "data/team"])
def test_a_bad_source_entry_is_a_settings_error_naming_the_setting(
    tmp_path: Path, bad: str
) -> None:
    with pytest.raises(pydantic.ValidationError, match="ACE3_DATASET_SOURCES"):
        _settings(tmp_path, f"s3://fine/, {bad}")


# -- listing on S3 ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source(object_store: ObjectStore) -> Iterator[tuple[Any, str]]:
    """(a boto3 client of the service's settings, a bucket of shards of every format)."""
    client = s3_client(object_store)
    bucket = new_bucket(client)
    put(
        client,
        bucket,
        {
            "pq/b.parquet": parquet_bytes(5),
            "pq/a.parquet": parquet_bytes(3),
            "pq/nested/c.parquet": parquet_bytes(2),
            "pq/README.md": b"not a shard",
            "pqx/d.parquet": parquet_bytes(1),  # another prefix that starts the same
            "named/x.parquet": parquet_bytes(2, inputs="pixels", targets="label"),
            "js/0.jsonl": jsonl_bytes(3),
            "js/1.jsonl.gz": b"\x1f\x8b",
            "js/2.jsonl.zst": b"(\xb5/\xfd",
            "js/notes.json": b"{}",
            "wds/000.tar": tar_bytes(2),
            "wds/001.tar": tar_bytes(3),
            "tok/0.bin": tokens_bytes(100),
            "tok/1.bin": tokens_bytes(7),
            "odd/0.bin": b"\x00\x01\x02",
            "bad/0.parquet": b"not a parquet file at all",
            "negative/0.parquet": negative_rows(parquet_bytes(5)),
        },
    )
    with source_credentials(object_store):
        settings = Settings(s3_endpoint_url=object_store.endpoint_url)
        yield source_client(settings), bucket


def test_parquet_shards_are_listed_with_their_row_counts(source: tuple[Any, str]) -> None:
    client, bucket = source
    manifest = list_manifest(client, f"s3://{bucket}/pq", "parquet")
    assert manifest.uri == f"s3://{bucket}/pq/"
    assert [(s.name, s.samples) for s in manifest.shards] == [
        ("a.parquet", 3),
        ("b.parquet", 5),
        ("nested/c.parquet", 2),
    ]
    assert manifest.total_samples == 10 and manifest.columns is None and manifest.dtype is None
    head = client.head_object(Bucket=bucket, Key="pq/a.parquet")
    first = manifest.shards[0]
    assert (first.size, first.etag) == (head["ContentLength"], head["ETag"].strip('"'))
    assert '"' not in first.etag
    again = list_manifest(client, f"s3://{bucket}/pq/", "parquet", page_size=1)
    assert again.digest() == manifest.digest()  # one listing, one digest, paginated or not


def test_a_listing_spans_pages(source: tuple[Any, str]) -> None:
    client, bucket = source
    calls: list[dict[str, Any]] = []
    real = client.list_objects_v2

    def counting(**request: Any) -> Any:
        calls.append(request)
        return real(**request)

    client.list_objects_v2 = counting
    try:
        manifest = list_manifest(client, f"s3://{bucket}/pq/", "parquet", page_size=2)
    finally:
        del client.list_objects_v2
    assert len(manifest.shards) == 3
    assert len(calls) == 2 and calls[1]["ContinuationToken"]
    assert all(call["MaxKeys"] == 2 for call in calls)


def test_parquet_columns_are_checked_in_every_footer(source: tuple[Any, str]) -> None:
    client, bucket = source
    named = f"s3://{bucket}/named/"
    with pytest.raises(SourceProblem, match="no column 'inputs'") as info:
        list_manifest(client, named, "parquet")
    assert info.value.field == "columns"
    manifest = list_manifest(
        client, named, "parquet", columns={"inputs": "pixels", "targets": "label"}
    )
    assert manifest.columns == {"inputs": "pixels", "targets": "label"}
    assert manifest.total_samples == 2
    defaults = list_manifest(client, f"s3://{bucket}/pq/", "parquet", columns={"inputs": "inputs"})
    assert defaults.columns is None  # the default mapping, spelled out or not: one digest


def test_a_file_that_is_not_parquet_is_refused_naming_it(source: tuple[Any, str]) -> None:
    client, bucket = source
    with pytest.raises(SourceProblem, match=r"shard 0\.parquet is not parquet"):
        list_manifest(client, f"s3://{bucket}/bad/", "parquet")


def test_jsonl_webdataset_and_tokens_keep_their_endings(source: tuple[Any, str]) -> None:
    client, bucket = source
    jsonl = list_manifest(client, f"s3://{bucket}/js/", "jsonl")
    assert [s.name for s in jsonl.shards] == ["0.jsonl", "1.jsonl.gz", "2.jsonl.zst"]
    assert jsonl.total_samples is None
    tars = list_manifest(client, f"s3://{bucket}/wds/", "webdataset")
    assert [s.name for s in tars.shards] == ["000.tar", "001.tar"]
    tokens = list_manifest(client, f"s3://{bucket}/tok/", "tokens")
    assert tokens.dtype == "uint16" and tokens.total_bytes == 214
    assert list_manifest(client, f"s3://{bucket}/tok/", "tokens", dtype="uint16") == tokens
    with pytest.raises(SourceProblem, match="not a whole number of uint32"):
        list_manifest(client, f"s3://{bucket}/tok/", "tokens", dtype="uint32")
    with pytest.raises(SourceProblem, match=r"0\.bin has 3 bytes"):
        list_manifest(client, f"s3://{bucket}/odd/", "tokens")


def test_an_empty_prefix_a_missing_bucket_and_too_many_shards_name_the_uri(
    source: tuple[Any, str],
) -> None:
    client, bucket = source
    with pytest.raises(SourceProblem, match="holds no tokens shards") as info:
        list_manifest(client, f"s3://{bucket}/pq/", "tokens")
    assert info.value.field == "uri"
    missing = f"s3://missing-{secrets.token_hex(4)}/x/"
    with pytest.raises(SourceProblem, match=r"cannot be read by the service: .*NoSuchBucket"):
        list_manifest(client, missing, "jsonl")
    with pytest.raises(SourceProblem, match="more than 2 parquet shards"):
        list_manifest(client, f"s3://{bucket}/pq/", "parquet", max_shards=2)


def test_a_large_footer_is_read_with_a_second_range(
    source: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ace3_control import dataset_sources

    client, bucket = source
    monkeypatch.setattr(dataset_sources, "FOOTER_GUESS_BYTES", 16)
    size = client.head_object(Bucket=bucket, Key="pq/b.parquet")["ContentLength"]
    assert parquet_footer(client, bucket, "pq/b.parquet", size) == (5, ["inputs", "targets"])


def test_a_footer_past_the_cap_is_refused_without_reading_it() -> None:
    from ace3_control.dataset_sources import FOOTER_GUESS_BYTES, MAX_FOOTER_BYTES

    size = 4 << 30  # a 4 GiB object whose footer length says almost all of it
    tail = bytes(FOOTER_GUESS_BYTES - 8) + struct.pack("<I", size - 100) + b"PAR1"
    asked: list[int] = []

    class Client:
        def get_object(self, *, Bucket: str, Key: str, Range: str) -> dict[str, Any]:
            first, last = (int(end) for end in Range.removeprefix("bytes=").split("-"))
            asked.append(last - first + 1)
            assert last - first + 1 <= MAX_FOOTER_BYTES, f"asked for {last - first + 1} bytes"
            return {"Body": io.BytesIO(tail[-(last - first + 1) :])}

    with pytest.raises(ValueError, match=f"footer is {size - 100} bytes, more than"):
        parquet_footer(Client(), "b", "k", size)
    assert asked == [FOOTER_GUESS_BYTES]


def test_a_row_count_a_shard_cannot_have_is_refused_naming_it(source: tuple[Any, str]) -> None:
    client, bucket = source
    with pytest.raises(SourceProblem, match=r"shard 0\.parquet .*claims -5 rows") as info:
        list_manifest(client, f"s3://{bucket}/negative/", "parquet")
    assert info.value.field == "uri"


def test_a_listing_examines_a_bounded_number_of_objects(source: tuple[Any, str]) -> None:
    from ace3_control.dataset_sources import list_shards

    client, bucket = source
    uri = f"s3://{bucket}/js/"  # four objects, three of them shards
    with pytest.raises(SourceProblem, match="holds more than 2 objects") as info:
        list_shards(client, uri, "jsonl", page_size=1, max_examined=2)
    assert info.value.field == "uri"
    assert len(list_shards(client, uri, "jsonl", max_examined=4)) == 3


def test_a_listing_past_its_deadline_is_refused_naming_the_uri(
    source: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ace3_control import dataset_sources

    client, bucket = source
    now = iter(range(0, 10_000, 100))  # every reading of the clock: 100 s later
    monkeypatch.setattr(dataset_sources.time, "monotonic", lambda: float(next(now)))
    with pytest.raises(SourceProblem, match="took longer than 150 seconds") as info:
        list_manifest(client, f"s3://{bucket}/pq/", "parquet", page_size=1, listing_seconds=150)
    assert info.value.field == "uri"


def test_footers_of_every_call_are_read_on_one_bounded_pool() -> None:
    from ace3_control.dataset_sources import FOOTER_READERS, read_footers

    threads: set[str] = set()
    lock = threading.Lock()

    def read(item: int) -> int:
        with lock:
            threads.add(threading.current_thread().name)
        return item * 2

    results: list[list[int]] = []
    callers = [
        threading.Thread(target=lambda: results.append(read_footers(read, range(50))))
        for _ in range(4)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert results == [[item * 2 for item in range(50)]] * 4
    assert len(threads) <= FOOTER_READERS and all(t.startswith("ace3-footer") for t in threads)
