"""The artifact store's contract, the same tests for both backends: the local directory and an
S3-compatible object store (a real SeaweedFS server started by the ``object_store`` fixture)."""

from __future__ import annotations

import hashlib
import io
import secrets
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ace3_control.settings import Settings
from ace3_control.storage import (
    ArtifactStore,
    LocalArtifactStore,
    StoredDigestError,
    StoredTooLargeError,
    open_store,
    tree_digest,
)
from tests.object_store import ObjectStore


def _s3_settings(object_store: ObjectStore, tmp_path: Path, bucket: str, prefix: str) -> Settings:
    return Settings(
        data_dir=tmp_path,
        storage_url=f"s3://{bucket}/{prefix}",
        s3_endpoint_url=object_store.endpoint_url,
    )


@pytest.fixture
def s3_env(object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> ObjectStore:
    for name, value in object_store.env("unused").items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    return object_store


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ArtifactStore]:
    if request.param == "local":
        yield LocalArtifactStore(tmp_path / "store")
        return
    object_store = request.getfixturevalue("s3_env")
    bucket = f"contract-{secrets.token_hex(6)}"  # a new bucket: the store creates it
    yield open_store(_s3_settings(object_store, tmp_path, bucket, "ace3/test"))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_bytes_go_in_and_come_back_out(store: ArtifactStore) -> None:
    data = secrets.token_bytes(3 * 1024 * 1024 + 17)  # more than one read chunk
    blob = store.put_stream("checkpoints/job-1/a.pt", io.BytesIO(data), sha256=_sha(data))
    assert (blob.key, blob.sha256, blob.size_bytes) == (
        "checkpoints/job-1/a.pt",
        _sha(data),
        len(data),
    )
    assert store.exists("checkpoints/job-1/a.pt")
    assert store.size("checkpoints/job-1/a.pt") == len(data)
    with store.open("checkpoints/job-1/a.pt") as handle:
        assert handle.read() == data
    assert b"".join(store.iter_bytes("checkpoints/job-1/a.pt")) == data
    replaced = store.put_stream("checkpoints/job-1/a.pt", io.BytesIO(b"new"))
    assert replaced.size_bytes == 3 and store.open("checkpoints/job-1/a.pt").read() == b"new"
    store.delete("checkpoints/job-1/a.pt")
    assert not store.exists("checkpoints/job-1/a.pt")
    store.delete("checkpoints/job-1/a.pt")  # deleting what is gone is no error


def test_missing_keys_are_file_not_found(store: ArtifactStore, tmp_path: Path) -> None:
    assert not store.exists("models/nobody/model.py")
    with pytest.raises(FileNotFoundError):
        store.open("models/nobody/model.py")
    with pytest.raises(FileNotFoundError):
        store.size("models/nobody/model.py")
    with pytest.raises(FileNotFoundError):
        store.fetch("models/nobody/model.py", tmp_path / "copy.py")
    assert not (tmp_path / "copy.py").exists()


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a/./b", "", "a/../b"])
def test_keys_that_could_escape_are_refused(store: ArtifactStore, key: str) -> None:
    with pytest.raises(ValueError, match="invalid storage key"):
        store.put_stream(key, io.BytesIO(b"x"))
    with pytest.raises(ValueError, match="invalid storage key"):
        store.exists(key)


def test_bytes_past_the_cap_or_with_another_sha256_are_never_stored(store: ArtifactStore) -> None:
    with pytest.raises(StoredTooLargeError, match="more than 10 bytes"):
        store.put_stream("artifacts/j/big", io.BytesIO(b"x" * 11), max_bytes=10)
    assert not store.exists("artifacts/j/big")
    assert (
        store.put_stream("artifacts/j/fits", io.BytesIO(b"x" * 10), max_bytes=10).size_bytes == 10
    )
    with pytest.raises(StoredDigestError, match="sha256"):
        store.put_stream("artifacts/j/bad", io.BytesIO(b"abc"), sha256=_sha(b"abd"))
    assert not store.exists("artifacts/j/bad")
    with pytest.raises(StoredTooLargeError):
        store.put_hashed(io.BytesIO(b"y" * 11), lambda sha: f"artifacts/j/{sha}", max_bytes=10)
    assert store.list("artifacts/j/") == ["artifacts/j/fits"]
    assert not list(store.staging_dir().iterdir()), "no staging file is left behind"


def test_content_addressed_puts_keep_the_stored_bytes(store: ArtifactStore) -> None:
    seen: list[str] = []

    def key_for(sha: str) -> str:
        seen.append(sha)
        return f"artifacts/job-2/{sha[:16]}"

    first = store.put_hashed(io.BytesIO(b"weights"), key_for)
    again = store.put_hashed(io.BytesIO(b"weights"), key_for)
    assert first == again and seen == [_sha(b"weights")] * 2
    assert store.open(first.key).read() == b"weights"


def test_fetch_verifies_what_it_copies(store: ArtifactStore, tmp_path: Path) -> None:
    store.put_stream("datasets/o/abc/data.npz", io.BytesIO(b"data"))
    copy = store.fetch("datasets/o/abc/data.npz", tmp_path / "in" / "data.npz", _sha(b"data"))
    assert copy.read_bytes() == b"data"
    with pytest.raises(StoredDigestError, match="do not match their recorded sha256"):
        store.fetch("datasets/o/abc/data.npz", tmp_path / "bad.npz", _sha(b"other"))
    assert not (tmp_path / "bad.npz").exists()


def test_a_directory_tree_is_stored_and_fetched_whole(store: ArtifactStore, tmp_path: Path) -> None:
    tree = tmp_path / "extracted"
    (tree / "pkg" / "sub").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("")
    (tree / "pkg" / "sub" / "model.py").write_text("def build_model(): ...\n")
    (tree / "empty").mkdir()
    with pytest.raises(ValueError, match="must end with /tree"):
        store.put_file("models/o/abc/package", tree)
    store.put_file("models/o/abc/tree", tree)
    assert not tree.exists(), "the staged tree is consumed"
    assert store.exists("models/o/abc/tree")
    fetched = store.fetch("models/o/abc/tree", tmp_path / "job" / "package")
    assert (fetched / "pkg" / "sub" / "model.py").read_text() == "def build_model(): ...\n"
    assert (fetched / "pkg" / "__init__.py").is_file() and (fetched / "empty").is_dir()
    assert store.list("models/o/") == ["models/o/abc/tree"]
    store.delete("models/o/abc/tree")
    assert not store.exists("models/o/abc/tree")


def _replace_tree(store: ArtifactStore, key: str, tree: Path) -> None:
    """Put ``tree`` in the place of the stored tree ``key`` behind the store's back (bytes
    changed in the bucket or on the volume): the directory, or the S3 store's one tar object."""
    if isinstance(store, LocalArtifactStore):
        shutil.rmtree(store.root / key)
        shutil.copytree(tree, store.root / key, symlinks=True)
        return
    from ace3_control.storage.s3 import S3ArtifactStore

    assert isinstance(store, S3ArtifactStore)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for child in sorted(tree.iterdir()):
            tar.add(child, arcname=child.name)
    store.client.put_object(Bucket=store.bucket, Key=store.prefix + key, Body=buffer.getvalue())


@pytest.mark.parametrize("change", ["bytes", "file added", "link added", "file removed"])
def test_a_fetched_tree_is_checked_against_its_recorded_digest(
    store: ArtifactStore, tmp_path: Path, change: str
) -> None:
    def package(folder: Path) -> Path:
        (folder / "pkg").mkdir(parents=True)
        (folder / "pkg" / "__init__.py").write_text("")
        (folder / "pkg" / "model.py").write_text("def build_model(): ...\n")
        return folder

    digest = tree_digest(package(tmp_path / "extracted"))
    assert digest == tree_digest(package(tmp_path / "same")), "the content, not where it is"
    store.put_file("models/o/t/tree", tmp_path / "extracted")
    fetched = store.fetch("models/o/t/tree", tmp_path / "first", digest)
    assert tree_digest(fetched) == digest

    changed = package(tmp_path / "changed")
    if change == "bytes":
        (changed / "pkg" / "model.py").write_text("import os; os.system('x')\n")
    elif change == "file added":
        (changed / "pkg" / "sitecustomize.py").write_text("")
    elif change == "link added":
        (changed / "pkg" / "data").symlink_to("model.py")
    else:
        (changed / "pkg" / "__init__.py").unlink()
    _replace_tree(store, "models/o/t/tree", changed)
    with pytest.raises(StoredDigestError, match="stored tree models/o/t/tree does not match"):
        store.fetch("models/o/t/tree", tmp_path / "job" / "package", digest)
    assert not (tmp_path / "job" / "package").exists(), "nothing is left as if it were valid"
    # A tree stored before digests were recorded is fetched as it is.
    assert store.fetch("models/o/t/tree", tmp_path / "legacy").is_dir()


def test_listing_is_by_prefix(store: ArtifactStore, tmp_path: Path) -> None:
    for key in ("logs/j1/a.txt", "logs/j1/b.txt", "logs/j10/c.txt", "logs/j2/d.txt"):
        store.put_stream(key, io.BytesIO(key.encode()))
    assert store.list("logs/j1/") == ["logs/j1/a.txt", "logs/j1/b.txt"]
    assert store.list("logs/j1") == ["logs/j1/a.txt", "logs/j1/b.txt", "logs/j10/c.txt"]
    assert len(store.list("")) == 4
    source = tmp_path / "file.bin"
    source.write_bytes(b"from a file")
    store.put_file("logs/j3/file.bin", source)
    assert source.exists(), "a file is copied, not consumed"
    assert store.open("logs/j3/file.bin").read() == b"from a file"


def test_presigned_urls_only_from_the_object_store(store: ArtifactStore) -> None:
    store.put_stream("checkpoints/j/step.pt", io.BytesIO(b"ckpt"))
    url = store.presigned_url("checkpoints/j/step.pt", 'attachment; filename="step.pt"')
    if isinstance(store, LocalArtifactStore):
        assert url is None
        return
    assert url is not None
    response = httpx.get(url)
    assert response.status_code == 200 and response.content == b"ckpt"
    assert response.headers["content-disposition"] == 'attachment; filename="step.pt"'
    tampered = url.replace("checkpoints/j/step.pt", "checkpoints/j/other.pt")
    assert httpx.get(tampered).status_code == 403


def test_s3_stores_under_their_prefix_and_upload_large_files_in_parts(
    s3_env: ObjectStore, tmp_path: Path
) -> None:
    import boto3
    from boto3.s3.transfer import TransferConfig

    bucket = f"prefixes-{secrets.token_hex(6)}"
    one = open_store(_s3_settings(s3_env, tmp_path, bucket, "one"))
    two = open_store(_s3_settings(s3_env, tmp_path, bucket, "two/deeper"))
    one.put_stream("k/a", io.BytesIO(b"1"))
    two.put_stream("k/a", io.BytesIO(b"2"))
    assert (one.open("k/a").read(), two.open("k/a").read()) == (b"1", b"2")
    assert one.list("") == ["k/a"] and two.list("k/") == ["k/a"]
    raw = boto3.client("s3", endpoint_url=s3_env.endpoint_url, region_name="us-east-1")
    names = [item["Key"] for item in raw.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(names) == ["one/k/a", "two/deeper/k/a"]

    part = 5 * 1024 * 1024  # S3's smallest part
    one.transfer = TransferConfig(multipart_threshold=part, multipart_chunksize=part)  # type: ignore[attr-defined]
    data = secrets.token_bytes(2 * part + 1)
    blob = one.put_stream("k/large", io.BytesIO(data), sha256=_sha(data))
    head = raw.head_object(Bucket=bucket, Key="one/k/large")
    assert head["ETag"].strip('"').endswith("-3"), "uploaded in three parts"
    assert head["Metadata"]["sha256"] == blob.sha256
    assert b"".join(one.iter_bytes("k/large")) == data


def test_a_storage_url_that_is_not_s3_is_refused(tmp_path: Path) -> None:
    for url in ("file:///tmp/x", "s3://", "s3://ab/prefix", "gs://bucket/x"):
        with pytest.raises(ValueError, match="ACE3_STORAGE_URL"):
            open_store(Settings(data_dir=tmp_path, storage_url=url))


def test_wrong_credentials_or_endpoint_fail_at_startup_naming_the_settings(
    s3_env: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ace3_control.storage.s3 import StoreUnavailableError

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StoreUnavailableError, match="AWS_SECRET_ACCESS_KEY"):
        open_store(_s3_settings(s3_env, tmp_path, "contract-denied", "x"))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_env.secret_key)
    closed = ObjectStore("http://127.0.0.1:9", s3_env.access_key, s3_env.secret_key)
    with pytest.raises(StoreUnavailableError, match="ACE3_S3_ENDPOINT_URL"):
        open_store(_s3_settings(closed, tmp_path, "contract-closed", "x"))
