"""Uploaded shard directories through the real API (in process, on a database of its own), on
the local artifact store and on a real S3 server (the session's SeaweedFS, where the shards go
straight to the store by presigned multipart): ``client.load_dataset(directory, format=...)``
uploads what is missing and makes a "shards" dataset; an interrupted upload resumes; the cap,
another owner's shards, a wrong ending, bytes that are not the shard announced and the format
checks are refused naming the field; the digest is stable; deleting keeps shared shards; what
bounds a manifest (names, one stored shard under one name, its size, footers, row counts, the
JSON body) and the list that never loads manifests."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import httpx
import pytest

import ace3
from ace3.client.shard_upload import ShardUploader, _StoreUnreachable
from ace3.config.shards import Shard, ShardManifest
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.settings import Settings
from tests.conftest import fresh_database, insert_job
from tests.integration.server.in_process_api import add_key, serve
from tests.integration.storage.test_dataset_sources import negative_rows
from tests.object_store import ObjectStore
from tests.shard_sources import (
    jsonl_bytes,
    new_bucket,
    parquet_bytes,
    s3_client,
    source_credentials,
    tokens_bytes,
)

LOCAL_CAP = 64 * 1024
S3_CAP = 12 * 1024 * 1024
PART = 5 * 1024 * 1024  # S3's smallest part: a shard of a little more has two
UPLOAD = ShardUploader.upload


class Owner(NamedTuple):
    id: str
    key: str
    model_id: str


class API(NamedTuple):
    base_url: str
    owner: Owner
    other: Owner
    storage: Path | None  # the local store's directory
    s3: Any = None
    bucket: str = ""
    app: Any = None

    def client(self, who: Owner | None = None) -> ace3.Client:
        key = (who or self.owner).key
        return ace3.Client(api_key=key, base_url=self.base_url, max_retries=0)

    def http(self, who: Owner | None = None) -> httpx.Client:
        key = (who or self.owner).key
        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {key}"})


def _owner(session: Any) -> Owner:
    job = insert_job(session, state="cancelled")
    key, _ = add_key(session, job.owner_id)
    return Owner(job.owner_id, key, job.model_id)


@pytest.fixture(scope="module")
def database() -> Iterator[tuple[str, list[Owner]]]:
    with fresh_database() as url:
        engine = make_sync_engine(url)
        with sync_session_factory(engine)() as session:
            owners = [_owner(session) for _ in range(4)]
        engine.dispose()
        yield url, owners


def _settings(url: str, redis_url: str, data_dir: Path, **fields: Any) -> Settings:
    return Settings(
        data_dir=data_dir,
        database_url=url,
        broker_url=redis_url,
        queue_name=f"ace3-shards-{secrets.token_hex(4)}",  # no worker reads it
        **fields,
    )


@pytest.fixture(scope="module")
def local(
    database: tuple[str, list[Owner]], redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[API]:
    url, owners = database
    data_dir = Path(tmp_path_factory.mktemp("shards-local"))
    with serve(_settings(url, redis_url, data_dir, max_upload_bytes=LOCAL_CAP)) as (app, base):
        yield API(base, owners[0], owners[1], data_dir / "storage", app=app)


@pytest.fixture(scope="module")
def s3(
    database: tuple[str, list[Owner]],
    redis_url: str,
    object_store: ObjectStore,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[API]:
    url, owners = database
    client = s3_client(object_store)
    bucket = new_bucket(client, "shards")
    settings = _settings(
        url,
        redis_url,
        Path(tmp_path_factory.mktemp("shards-s3")),
        max_upload_bytes=S3_CAP,
        storage_url=f"s3://{bucket}/ace3",
        s3_endpoint_url=object_store.endpoint_url,
        shard_part_bytes=PART,
    )
    with source_credentials(object_store), serve(settings) as (_, base):
        yield API(base, owners[2], owners[3], None, client, bucket)


def _write(directory: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return directory


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _locs(response: httpx.Response) -> list[list[Any]]:
    assert response.status_code == 422, response.text
    return [error["loc"] for error in response.json()["detail"]]


def _upload(http: httpx.Client, data: bytes, sha256: str | None = None) -> httpx.Response:
    return http.post(
        "/v1/datasets/shards/upload",
        files={"file": ("x.jsonl", data)},
        data={"sha256": sha256 or _sha(data)},
    )


def _counting(monkeypatch: pytest.MonkeyPatch, fail: Collection[str] = ()) -> list[str]:
    """The names of the shards uploaded from now on (those in ``fail`` raise instead)."""
    uploaded: list[str] = []
    original = UPLOAD

    def upload(self: ShardUploader, shard: Any) -> None:
        if shard.name in fail:
            raise ConnectionError(f"interrupted before {shard.name}")
        original(self, shard)
        uploaded.append(shard.name)

    monkeypatch.setattr(ShardUploader, "upload", upload)
    return uploaded


def test_a_parquet_directory_becomes_a_shards_dataset_with_a_stable_digest(
    local: API, tmp_path: Path
) -> None:
    files = {"b/1.parquet": parquet_bytes(6), "a.parquet": parquet_bytes(4), "notes.txt": b"x"}
    directory = _write(tmp_path / "tables", files)
    with local.client() as client:
        ref = client.load_dataset(directory, format="parquet")
        again = client.load_dataset(directory, format="parquet", name="other name")
    assert ref.uploaded and not again.uploaded and again.id == ref.id
    dataset = ref.dataset
    assert (dataset.kind, dataset.format, dataset.shard_count, dataset.samples) == (
        "shards",
        "parquet",
        2,
        10,
    )
    assert (dataset.name, dataset.uri) == ("tables", None)
    assert dataset.size_bytes == len(files["a.parquet"]) + len(files["b/1.parquet"])
    expected = ShardManifest(
        uri=f"datasets/{local.owner.id}/shards/",
        format="parquet",
        shards=[
            Shard(name=name, size=len(files[name]), etag=_sha(files[name]), samples=rows)
            for name, rows in (("a.parquet", 4), ("b/1.parquet", 6))
        ],
    )
    assert dataset.sha256 == expected.digest()
    for name in ("a.parquet", "b/1.parquet"):  # each stored once, under its sha256
        stored = local.storage / f"datasets/{local.owner.id}/shards/{_sha(files[name])}"  # type: ignore[operator]
        assert stored.read_bytes() == files[name]
    with local.http() as http:
        shown = http.get(f"/v1/datasets/{ref.id}").json()
        assert shown["kind"] == "shards" and shown["sha256"] == expected.digest()
        job = {"model_id": local.owner.model_id, "dataset_id": ref.id, "config": {"epochs": 1}}
        assert http.post("/v1/jobs", json=job).status_code == 201  # rows are counted


def test_an_interrupted_upload_resumes_with_the_shards_not_stored(
    local: API, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {f"part-{i}.jsonl": jsonl_bytes(3 + i) for i in range(4)}
    directory = _write(tmp_path / "lines", files)
    failing = _counting(monkeypatch, fail={"part-2.jsonl", "part-3.jsonl"})
    with local.client() as client, pytest.raises(ConnectionError):
        client.load_dataset(directory, format="jsonl")
    assert sorted(failing) == ["part-0.jsonl", "part-1.jsonl"]
    resumed = _counting(monkeypatch)
    with local.client() as client:
        ref = client.load_dataset(directory, format="jsonl")
    assert sorted(resumed) == ["part-2.jsonl", "part-3.jsonl"]
    assert (ref.dataset.shard_count, ref.dataset.samples) == (4, None)
    renamed = _write(tmp_path / "renamed", {f"x/{n}": data for n, data in files.items()})
    nothing = _counting(monkeypatch)
    with local.client() as client:
        other = client.load_dataset(renamed, format="jsonl")
    assert nothing == [] and other.uploaded and other.id != ref.id  # other names: other digest


def test_what_the_api_refuses(local: API, tmp_path: Path) -> None:
    data = jsonl_bytes(2)
    with local.http() as http:
        assert _upload(http, data).status_code == 201
        assert _upload(http, data).status_code == 200
        lying = _upload(http, data + b"\n", sha256=_sha(data))
        assert _locs(lying) == [["body", "sha256"]] and "not the shard announced" in lying.text
        too_big = _upload(http, b"0" * (LOCAL_CAP + 1))
        assert too_big.status_code == 413
        far_too_big = _upload(http, b"0" * (LOCAL_CAP + 65 * 1024))
        assert far_too_big.status_code == 413  # (refused by its length, before it is read)

        def create(format: str, name: str, body: bytes, **fields: Any) -> httpx.Response:
            entry = {"name": name, "sha256": _sha(body), "size": len(body)}
            return http.post(
                "/v1/datasets/shards", json={"format": format, "shards": [entry], **fields}
            )

        assert _locs(create("jsonl", "a.txt", data)) == [["body", "shards", 0, "name"]]
        assert _locs(create("jsonl", "../a.jsonl", data)) == [["body", "shards", 0, "name"]]
        assert _locs(create("jsonl", "a.jsonl", data, dtype="uint16")) == [["body", "dtype"]]
        missing = create("jsonl", "a.jsonl", b"never uploaded")
        assert _locs(missing) == [["body", "shards", 0, "sha256"]]
        assert missing.json()["detail"][0]["type"] == "shard_not_stored"
        odd = b"\x01\x02\x03"
        assert _upload(http, odd).status_code == 201
        assert _locs(create("tokens", "t.bin", odd)) == [["body", "shards", 0, "size"]]
        not_parquet = create("parquet", "t.parquet", data)
        assert _locs(not_parquet) == [["body", "shards", 0, "name"]]
        assert "is not parquet" in not_parquet.text
        named = parquet_bytes(2, inputs="x")
        assert _upload(http, named).status_code == 201
        assert _locs(create("parquet", "n.parquet", named)) == [["body", "columns"]]
        columns = {"inputs": "x", "targets": "targets"}
        assert create("parquet", "n.parquet", named, columns=columns).status_code == 201
        direct = http.post("/v1/datasets/shards/direct", json={"sha256": _sha(data), "size": 2})
        assert direct.status_code == 409  # a local store takes shards through the API
    with httpx.Client(base_url=local.base_url) as anonymous:
        assert _upload(anonymous, data).status_code == 401
    with local.client() as client, pytest.raises(ace3.PayloadTooLargeError):
        client.load_dataset(_write(tmp_path / "big", {"a.bin": b"0" * (LOCAL_CAP + 2)}), format="tokens")  # fmt: skip


def test_another_owners_shards_are_not_yours(local: API) -> None:
    data = jsonl_bytes(5)
    with local.http() as mine, local.http(local.other) as theirs:
        assert _upload(mine, data).status_code in (200, 201)
        assert mine.get(f"/v1/datasets/shards/{_sha(data)}").json()["size_bytes"] == len(data)
        assert theirs.get(f"/v1/datasets/shards/{_sha(data)}").status_code == 404
        asked = theirs.post("/v1/datasets/shards/missing", json={"sha256": [_sha(data)]}).json()
        assert asked == {"missing": [_sha(data)], "direct": False}
        entry = {"name": "a.jsonl", "sha256": _sha(data), "size": len(data)}
        refused = theirs.post("/v1/datasets/shards", json={"format": "jsonl", "shards": [entry]})
        assert _locs(refused) == [["body", "shards", 0, "sha256"]]


def test_deleting_keeps_the_shards_another_dataset_names(local: API, tmp_path: Path) -> None:
    shared, own = jsonl_bytes(7), jsonl_bytes(8)
    with local.client() as client:
        first = client.load_dataset(_write(tmp_path / "one", {"s.jsonl": shared, "o.jsonl": own}), format="jsonl")  # fmt: skip
        second = client.load_dataset(_write(tmp_path / "two", {"s.jsonl": shared}), format="jsonl")
        base = local.storage / f"datasets/{local.owner.id}/shards"  # type: ignore[operator]
        client.datasets.delete(first.id)
        assert (base / _sha(shared)).is_file() and not (base / _sha(own)).exists()
        with local.http() as http:
            assert http.get(f"/v1/datasets/shards/{_sha(own)}").status_code == 404
        client.datasets.delete(second.id)
        assert not (base / _sha(shared)).exists()
        again = client.load_dataset(tmp_path / "one", format="jsonl")  # uploaded again: revived
        assert again.id == first.id and again.uploaded and (base / _sha(own)).is_file()


def test_on_s3_the_shards_go_straight_to_the_store(
    s3: API, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = (bytes(range(256)) * (PART // 256 + 3))[: PART + 600]  # two parts: 5 MiB, 600 bytes
    files = {"0.bin": tokens_bytes(64), "1.bin": big, "2.bin": tokens_bytes(10)}
    directory = _write(tmp_path / "tokens", files)
    parts: list[int] = []
    put_part = ShardUploader._put_part

    def counting_put(self: ShardUploader, plain: Any, part: Any, data: bytes) -> str:
        parts.append(len(data))
        return put_part(self, plain, part, data)

    monkeypatch.setattr(ShardUploader, "_put_part", counting_put)
    through_api = mock.Mock(side_effect=AssertionError("through the API"))
    monkeypatch.setattr(ShardUploader, "_through_api", through_api)
    failing = _counting(monkeypatch, fail={"2.bin"})
    with s3.client() as client, pytest.raises(ConnectionError):
        client.load_dataset(directory, format="tokens")
    assert sorted(failing) == ["0.bin", "1.bin"] and sorted(parts) == [128, 600, PART]
    resumed = _counting(monkeypatch)
    with s3.client() as client:
        ref = client.load_dataset(directory, format="tokens", dtype="uint16")
    assert resumed == ["2.bin"] and ref.uploaded
    assert (ref.dataset.kind, ref.dataset.shard_count) == ("shards", 3)
    keys = {
        item["Key"]: item["Size"]
        for item in s3.s3.list_objects_v2(Bucket=s3.bucket, Prefix="ace3/")["Contents"]
    }
    stored = {
        f"ace3/datasets/{s3.owner.id}/shards/{_sha(data)}": len(data) for data in files.values()
    }
    assert stored.items() <= keys.items()
    assert not any(key.startswith("ace3/uploads/") for key in keys)  # nothing left staged
    body = s3.s3.get_object(Bucket=s3.bucket, Key=f"ace3/datasets/{s3.owner.id}/shards/{_sha(big)}")
    assert body["Body"].read() == big


def test_on_s3_a_direct_upload_is_checked_and_capped(s3: API) -> None:
    data, claimed = tokens_bytes(100), tokens_bytes(101)
    with s3.http() as http:
        assert http.post("/v1/datasets/shards/missing", json={"sha256": [_sha(data)]}).json()[
            "direct"
        ]
        too_big = {"sha256": _sha(data), "size": S3_CAP + 1}
        assert http.post("/v1/datasets/shards/direct", json=too_big).status_code == 413
        start = http.post("/v1/datasets/shards/direct", json={"sha256": _sha(claimed), "size": len(data)})  # fmt: skip
        assert start.status_code == 201, start.text
        upload = start.json()
        [part] = upload["parts"]
        with httpx.Client() as plain:  # (no API key goes to the store)
            assert plain.put(part["url"], content=data + b"!").status_code == 403  # other size
            etag = plain.put(part["url"], content=data).headers["etag"]
        done = {"sha256": _sha(claimed), "size": len(data), "token": upload["token"],
                "upload_id": upload["upload_id"], "etags": [etag]}  # fmt: skip
        lying = http.post("/v1/datasets/shards/direct/complete", json=done)
        assert _locs(lying) == [["body", "sha256"]]
        assert http.get(f"/v1/datasets/shards/{_sha(claimed)}").status_code == 404
        again = http.post("/v1/datasets/shards/direct/complete", json=done)
        assert _locs(again) == [["body", "upload_id"]]  # (the upload is over)
        with s3.http(s3.other) as theirs:  # another owner cannot complete or abort it
            fresh = http.post("/v1/datasets/shards/direct", json={"sha256": _sha(data), "size": len(data)}).json()  # fmt: skip
            stolen = {**done, "sha256": _sha(data), "token": fresh["token"],
                      "upload_id": fresh["upload_id"]}  # fmt: skip
            assert _locs(theirs.post("/v1/datasets/shards/direct/complete", json=stolen)) == [
                ["body", "upload_id"]
            ]
        abort = {"token": fresh["token"], "upload_id": fresh["upload_id"]}
        assert http.post("/v1/datasets/shards/direct/abort", json=abort).status_code == 204
    listed = s3.s3.list_objects_v2(Bucket=s3.bucket, Prefix="ace3/uploads/").get("Contents", [])
    assert listed == []


def test_when_the_store_is_out_of_reach_the_shards_go_through_the_api(
    s3: API, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(self: ShardUploader, plain: Any, part: Any, data: bytes) -> str:
        raise _StoreUnreachable("connection refused")

    monkeypatch.setattr(ShardUploader, "_put_part", unreachable)
    files = {"a.jsonl": jsonl_bytes(11), "b.jsonl": jsonl_bytes(12)}
    with s3.client() as client, pytest.warns(UserWarning, match="through the API instead"):
        ref = client.load_dataset(_write(tmp_path / "lines", files), format="jsonl")
    assert ref.dataset.shard_count == 2
    for data in files.values():
        key = f"ace3/datasets/{s3.owner.id}/shards/{_sha(data)}"
        assert s3.s3.get_object(Bucket=s3.bucket, Key=key)["Body"].read() == data


def _entries(*shards: tuple[str, bytes]) -> list[dict[str, Any]]:
    return [{"name": name, "sha256": _sha(data), "size": len(data)} for name, data in shards]


def test_what_bounds_a_manifest(local: API, monkeypatch: pytest.MonkeyPatch) -> None:
    from ace3_control import dataset_sources
    from ace3_server.services import dataset_registry

    data, table, negative = jsonl_bytes(3), parquet_bytes(3), negative_rows(parquet_bytes(5))
    with local.http() as http:
        for shard in (data, table, negative):
            assert _upload(http, shard).status_code in (200, 201)

        def create(format: str, *shards: tuple[str, bytes]) -> httpx.Response:
            body = {"format": format, "shards": _entries(*shards)}
            return http.post("/v1/datasets/shards", json=body)

        long_name = create("jsonl", ("d" * 251 + ".jsonl", data))
        assert _locs(long_name) == [["body", "shards", 0, "name"]]
        copies = create("jsonl", ("a.jsonl", data), ("b.jsonl", data))
        assert _locs(copies) == [["body", "shards", 1, "sha256"]]
        assert "same bytes" in copies.text and "'a.jsonl'" in copies.text
        claims = create("parquet", ("n.parquet", negative))
        assert _locs(claims) == [["body", "shards", 0, "name"]] and "-5 rows" in claims.text
        monkeypatch.setattr(dataset_sources, "MAX_FOOTER_BYTES", 64)
        footer = create("parquet", ("t.parquet", table))
        assert (
            _locs(footer) == [["body", "shards", 0, "name"]] and "more than the 64" in footer.text
        )
        monkeypatch.setattr(dataset_registry, "MAX_MANIFEST_BYTES", 100)
        manifest = create("jsonl", ("m.jsonl", data))
        assert _locs(manifest) == [["body", "shards"]] and "more than the 100" in manifest.text
        monkeypatch.undo()
        assert create("jsonl", ("d" * 250 + ".jsonl", data)).status_code == 201


def test_a_json_body_past_the_cap_is_refused(local: API, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local.app.state.settings, "max_json_bytes", 1000)
    body = {"format": "jsonl", "shards": _entries(*((f"{i}.jsonl", b"x") for i in range(20)))}
    raw = httpx.Request("POST", "/", json=body).content
    assert len(raw) > 1000
    with local.http() as http:
        declared = http.post("/v1/datasets/shards", json=body)
        assert declared.status_code == 413 and "ACE3_MAX_JSON_BYTES" in declared.text
        chunked = http.post(
            "/v1/datasets/shards",
            content=iter([raw[:600], raw[600:]]),  # no Content-Length: counted as it streams
            headers={"content-type": "application/json"},
        )
        assert chunked.status_code == 413 and "ACE3_MAX_JSON_BYTES" in chunked.text
        small = http.post("/v1/datasets/shards", json={"format": "jsonl", "shards": []})
        assert small.status_code == 422


def test_listing_datasets_never_loads_a_manifest(local: API, tmp_path: Path) -> None:
    from sqlalchemy import event

    with local.client() as client:
        ref = client.load_dataset(_write(tmp_path / "d", {"a.jsonl": jsonl_bytes(4)}), format="jsonl")  # fmt: skip
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    engine = local.app.state.session_factory.kw["bind"].sync_engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        with local.http() as http:
            assert http.get("/v1/datasets", params={"limit": 200}).status_code == 200
            assert http.get(f"/v1/datasets/{ref.id}").json()["shard_count"] == 1
    finally:
        event.remove(engine, "before_cursor_execute", record)
    reads = [statement for statement in statements if "FROM datasets" in statement]
    assert reads and not [statement for statement in reads if "manifest" in statement]
