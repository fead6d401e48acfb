"""An uploaded shard directory (kind "shards") streamed from the artifact store: each shard is
the store's object ``manifest.uri + sha256``, verified by that sha256 and the manifest's size
while it is read (the store's own ETag is never looked at); a stored shard whose bytes differ,
or one the store lost, fails the attempt naming it and never reaches the job or the cache. The
job directory of such a dataset streams it (no store object at its prefix is looked for), and a
manifest that reads outside its owner's shards is refused before anything runs."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import pytest

from ace3.config.shards import REQUEST_DIR, Shard, ShardManifest
from ace3.files import sha256_file
from ace3.runtime.job_spec import JobSpec
from ace3_control.settings import Settings
from ace3_control.storage import LocalArtifactStore
from ace3_worker.job_dir import prepare_job_directory
from ace3_worker.shard_feed import ShardFeed
from ace3_worker.shard_streams import ShardStream, stream_dataset

OWNER = "owner1"
PREFIX = f"datasets/{OWNER}/shards/"
CONTENTS = {
    f"part/{i}.jsonl": f'{{"inputs": [{i}], "targets": {i}}}\n'.encode() * (i + 2) for i in range(3)
}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def stored(tmp_path: Path) -> SimpleNamespace:
    """The shards in a local artifact store, as the API stores them, and their manifest."""
    store = LocalArtifactStore(tmp_path / "store")
    for data in CONTENTS.values():
        source = tmp_path / "upload"
        source.write_bytes(data)
        store.put_file(PREFIX + sha256(data), source)
    manifest = ShardManifest(
        uri=PREFIX,
        format="jsonl",
        shards=[
            Shard(name=name, size=len(data), etag=sha256(data))
            for name, data in sorted(CONTENTS.items())
        ],
    )
    return SimpleNamespace(store=store, manifest=manifest, root=tmp_path / "store")


class Attempt:
    """A job directory streaming the uploaded dataset, and its running feeder."""

    def __init__(self, root: Path, stored: SimpleNamespace) -> None:
        self.output = root / "output"
        (self.output / REQUEST_DIR).mkdir(parents=True)
        _, self.stream = stream_dataset(
            "train",
            stored.manifest,
            root / "data" / "train",
            self.output / REQUEST_DIR,
            PurePosixPath,
            kind="shards",
        )
        self.lines: list[str] = []
        self.reasons: list[str] = []
        self.failed = threading.Event()

        def fail(reason: str) -> None:
            self.reasons.append(reason)
            self.failed.set()

        settings = Settings(data_dir=root / "data-dir", dataset_cache_dir=root / "cache")
        streams: tuple[ShardStream, ...] = (self.stream,)
        self.feed = ShardFeed.for_attempt(
            settings, streams, self.output, log=self.lines.append, fail=fail, store=stored.store
        ).start()

    def request(self, *need: str) -> None:
        temporary = self.output / REQUEST_DIR / ".train-r0-w0.json.tmp"
        temporary.write_text(json.dumps({"need": list(need)}))
        temporary.rename(self.output / REQUEST_DIR / "train-r0-w0.json")

    def cached(self) -> list[Path]:
        return list(self.feed.cache.root.glob("*/*.jsonl"))


def test_an_uploaded_shard_is_read_from_the_store_verified_by_its_sha256(
    tmp_path: Path, stored: SimpleNamespace
) -> None:
    attempt = Attempt(tmp_path / "job", stored)
    try:
        attempt.request("000000.jsonl", "000002.jsonl")
        shards = attempt.stream.directory
        wait_for(lambda: {p.name for p in shards.iterdir()} == {"000000.jsonl", "000002.jsonl"})
    finally:
        attempt.feed.stop()
    assert not attempt.failed.is_set()
    assert (shards / "000002.jsonl").read_bytes() == CONTENTS["part/2.jsonl"]
    digest = sha256(CONTENTS["part/2.jsonl"])
    sidecar = json.loads(
        Path(f"{attempt.feed.cache.path(attempt.stream.digest, '000002.jsonl')}.sha256").read_text()
    )
    assert sidecar["sha256"] == digest and sidecar["uri"] == PREFIX
    size = len(CONTENTS["part/2.jsonl"])
    assert f"'part/2.jsonl' ({size} bytes): sha256 {digest}" in " ".join(attempt.lines)


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda data: data[:-1] + b"?", "its sha256 is {found}, uploaded {sha256}"),
        (lambda data: data[:-3], "it holds {size_less} bytes, uploaded {size}"),
        (lambda data: data + b"\n", "it holds more than the {size} bytes uploaded"),
    ],
    ids=["other-bytes", "shorter", "longer"],
)
def test_a_corrupted_stored_shard_fails_the_attempt_naming_it(
    tmp_path: Path,
    stored: SimpleNamespace,
    damage: Callable[[bytes], bytes],
    said: str,
) -> None:
    data = CONTENTS["part/1.jsonl"]
    key = PREFIX + sha256(data)
    (stored.root / key).write_bytes(damage(data))
    attempt = Attempt(tmp_path / "job", stored)
    try:
        attempt.request("000001.jsonl")
        assert attempt.failed.wait(10)
    finally:
        attempt.feed.stop()
    change = said.format(
        found=sha256(damage(data)), sha256=sha256(data), size=len(data), size_less=len(data) - 3
    )
    assert attempt.reasons == [
        f"dataset shard 'part/1.jsonl' ({key}) is not what was uploaded: {change}; the "
        "artifact store is corrupted"
    ]
    assert list(attempt.stream.directory.iterdir()) == [] and attempt.cached() == []


def test_a_shard_missing_from_the_store_fails_the_attempt_naming_it(
    tmp_path: Path, stored: SimpleNamespace
) -> None:
    key = PREFIX + sha256(CONTENTS["part/0.jsonl"])
    stored.store.delete(key)
    attempt = Attempt(tmp_path / "job", stored)
    try:
        attempt.request("000000.jsonl")
        assert attempt.failed.wait(10)
    finally:
        attempt.feed.stop()
    assert attempt.reasons == [
        f"dataset shard 'part/0.jsonl' is gone from the artifact store ({key}): the store lost "
        "it since it was uploaded"
    ]
    assert list(attempt.stream.directory.iterdir()) == [] and attempt.cached() == []


def _row(**fields: object) -> SimpleNamespace:
    return SimpleNamespace(id="d", filename="d", entry_module=None, factory="build_model", **fields)


def test_a_job_on_an_uploaded_shard_directory_streams_it_and_reads_only_its_owners_shards(
    tmp_path: Path, stored: SimpleNamespace
) -> None:
    store = stored.store
    (tmp_path / "model.py").write_text("x = 1\n")
    store.put_file("models/o/m/model.py", tmp_path / "model.py")
    model = _row(
        kind="file", storage_key="models/o/m/model.py", sha256=sha256_file(tmp_path / "model.py")
    )
    job = SimpleNamespace(
        id="job1", config={}, model_kwargs={}, micro_batch_halvings=0, num_processes=1
    )
    (tmp_path / "work").mkdir()

    def prepare(manifest: ShardManifest, attempt: int) -> Path:
        dataset = _row(
            kind="shards",
            owner_id=OWNER,
            manifest=manifest.model_dump(mode="json"),
            storage_key=manifest.uri,  # (a prefix: no object)
            sha256=manifest.digest(),
        )
        directory = prepare_job_directory(
            tmp_path / "work", store, job, attempt, model, dataset, None, None,  # type: ignore[arg-type]  # rows as namespaces
            visible_root=PurePosixPath("/job"), dataset_cache_bytes=10**6,
        )  # fmt: skip
        assert [(s.split, s.kind) for s in directory.streams] == [("train", "shards")]
        return directory.job_file

    spec = JobSpec.model_validate_json(prepare(stored.manifest, 1).read_text())
    assert spec.dataset.stream is not None and spec.dataset.path == "/job/data/train/shards"
    assert [(s.file, s.size) for s in spec.dataset.stream.shards] == [
        (f"{i:06d}.jsonl", len(CONTENTS[f"part/{i}.jsonl"])) for i in range(3)
    ]

    elsewhere = stored.manifest.model_copy(update={"uri": "datasets/other/shards/"})
    with pytest.raises(ValueError, match=r"uri 'datasets/other/shards/' is not its owner's"):
        prepare(elsewhere, 2)
    shards = [s.model_copy(update={"etag": "../../models/o/m/model.py"}) for s in elsewhere.shards]
    unhashed = stored.manifest.model_copy(update={"shards": shards})
    with pytest.raises(ValueError, match=r"shard 'part/0.jsonl' has no sha256 in its manifest"):
        prepare(unhashed, 3)
