"""The SDK's artifact and checkpoint calls and the local sync built on them, over a fake API:
downloads are atomic and verified, only changed files are fetched, mapped prefixes decide where
files go, errors are retried on the next sync, and keep-last-N never deletes the newest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest

import ace3
from ace3.trainers.downloads import ArtifactSync, CheckpointSync
from tests.unit.sdk.sdk_fakes import MockAPI, job_json


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FakeArtifacts:
    """A job's artifacts on a fake server: tests change ``files`` as the job would."""

    def __init__(self, api: MockAPI, job_id: str = "job_1") -> None:
        self.files: dict[str, bytes] = {}
        self.versions: dict[str, int] = {}
        self.downloads: list[str] = []
        self.fail_downloads = 0
        self.corrupt: set[str] = set()
        api.route("GET", f"/v1/jobs/{job_id}/artifacts", self.listing)
        api.route("GET", f"/v1/jobs/{job_id}/artifacts/.+", self.download)

    def put(self, path: str, data: bytes) -> None:
        self.files[path] = data
        self.versions[path] = self.versions.get(path, 0) + 1

    def listing(self, request: httpx.Request) -> httpx.Response:
        prefix = request.url.params.get("prefix")
        data = [
            {
                "path": path,
                "size_bytes": len(content),
                "sha256": _sha(content),
                "version": self.versions[path],
                "attempt": 1,
                "updated_at": "2025-01-01T00:00:00Z",
            }
            for path, content in sorted(self.files.items())
            if not prefix or path == prefix or path.startswith(prefix + "/")
        ]
        return httpx.Response(200, json={"data": data})

    def download(self, request: httpx.Request) -> httpx.Response:
        path = unquote(request.url.path.split("/artifacts/", 1)[1])
        self.downloads.append(path)
        if self.fail_downloads:
            self.fail_downloads -= 1
            return httpx.Response(404, json={"detail": "artifact not found"})
        if path not in self.files:
            return httpx.Response(404, json={"detail": "artifact not found"})
        content = self.files[path]
        body = content[:-1] + b"?" if path in self.corrupt else content
        return httpx.Response(200, content=body, headers={"x-checksum-sha256": _sha(content)})


# -- client.jobs.artifacts / download_artifact ------------------------------------------------


def test_artifacts_are_listed_and_downloaded_atomically_and_verified(
    api: MockAPI, tmp_path: Path
) -> None:
    fake = FakeArtifacts(api)
    fake.put("tensorboard/run 1/events.out", b"event bytes")
    fake.put("trace.json", b"{}")
    fake.corrupt.add("trace.json")
    client = api.client()

    (listed, _) = client.jobs.artifacts("job_1")
    assert isinstance(listed, ace3.client.types.Artifact) and listed.version == 1
    assert listed.sha256 == _sha(b"event bytes") and listed.size_bytes == 11

    path = client.jobs.download_artifact("job_1", listed.path, tmp_path)
    assert path == tmp_path / "events.out" and path.read_bytes() == b"event bytes"
    assert "/artifacts/tensorboard/run%201/events.out" in str(api.requests[-1].url)

    with pytest.raises(ace3.ChecksumMismatchError):
        client.jobs.download_artifact("job_1", "trace.json", tmp_path / "trace.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.out"], "nothing half-written"


def test_artifact_prefix_is_sent_and_paths_that_leave_the_directory_are_refused(
    api: MockAPI, tmp_path: Path
) -> None:
    FakeArtifacts(api)
    client = api.client()
    client.jobs.artifacts("job_1", prefix="artifact://tensorboard")
    assert api.requests[-1].url.params["prefix"] == "tensorboard"
    for bad in ("../secret", "a//b", "/", "a/./b"):
        with pytest.raises(ValueError, match="path="):
            client.jobs.download_artifact("job_1", bad, tmp_path)


def test_download_artifacts_keeps_relative_paths_resumes_and_never_follows_a_link(
    api: MockAPI, tmp_path: Path
) -> None:
    fake = FakeArtifacts(api)
    fake.put("huggingface/config.json", b"{}")
    fake.put("huggingface/model.safetensors", b"weights")
    fake.put("adapter/adapter_config.json", b"{'r': 8}")
    client = api.client()
    out = tmp_path / "out"

    paths = client.jobs.download_artifacts("job_1", out)
    assert paths == [out / "adapter/adapter_config.json", out / "huggingface/config.json",
                     out / "huggingface/model.safetensors"]  # fmt: skip
    assert (out / "huggingface/model.safetensors").read_bytes() == b"weights"

    # again: the files already there (same sha256) are kept; a changed one is fetched again
    fake.downloads.clear()
    fake.put("huggingface/config.json", b'{"a": 1}')
    assert client.jobs.download_artifacts("job_1", out) == paths
    assert fake.downloads == ["huggingface/config.json"]
    assert (out / "huggingface/config.json").read_bytes() == b'{"a": 1}'

    # only under a prefix
    fake.downloads.clear()
    only = client.jobs.download_artifacts("job_1", tmp_path / "only", prefix="adapter")
    assert only == [tmp_path / "only/adapter/adapter_config.json"]
    assert fake.downloads == ["adapter/adapter_config.json"]

    # a corrupt download leaves nothing behind and raises
    fake.corrupt.add("huggingface/model.safetensors")
    with pytest.raises(ace3.ChecksumMismatchError):
        client.jobs.download_artifacts("job_1", tmp_path / "bad")
    assert not (tmp_path / "bad/huggingface/model.safetensors").exists()

    # a symbolic link in the way (a job names its artifact paths) is refused, nothing written
    fake.corrupt.clear()
    outside = tmp_path / "outside"
    outside.mkdir()
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "huggingface").symlink_to(outside)
    with pytest.raises(ValueError, match="is a symbolic link"):
        client.jobs.download_artifacts("job_1", linked)
    assert list(outside.iterdir()) == []


# -- checkpoints: find by sha256, resume_from_checkpoint ---------------------------------------


def test_checkpoints_are_found_by_sha256_and_a_job_can_start_from_one(
    api: MockAPI, tmp_path: Path
) -> None:
    digest = _sha(b"weights")
    found = {"id": "ck_1", "job_id": "job_0", "name": "step-00000046.pt", "step": 46}
    api.route("GET", "/v1/checkpoints", httpx.Response(200, json={"data": [found]}))
    api.route("POST", "/v1/jobs", httpx.Response(201, json=job_json()))
    client = api.client()

    local = tmp_path / "step-00000046.pt"
    local.write_bytes(b"weights")
    (checkpoint,) = client.checkpoints.find_file(local)
    assert api.requests[-1].url.params["sha256"] == digest
    assert (checkpoint.id, checkpoint.job_id) == ("ck_1", "job_0")
    assert client.checkpoints.find(sha256=digest.upper())[0].id == "ck_1"
    with pytest.raises(ValueError, match="sha256="):
        client.checkpoints.find(sha256="not-a-hash")

    client.jobs.create(model_id="m", dataset_id="d", resume_from_checkpoint=checkpoint)
    assert json.loads(api.requests[-1].content)["resume_from_checkpoint"] == "ck_1"
    client.jobs.create(model_id="m", dataset_id="d")
    assert "resume_from_checkpoint" not in json.loads(api.requests[-1].content)


# -- ArtifactSync ------------------------------------------------------------------------------


def test_artifact_sync_mirrors_mapped_prefixes_and_fetches_only_what_changed(
    api: MockAPI, tmp_path: Path
) -> None:
    fake = FakeArtifacts(api)
    fake.put("tensorboard/events.out", b"v1")
    fake.put("tensorboard/nested/blob.bin", b"\x00\x01")
    fake.put("model_checkpoint_0/best.pt", b"best")
    fake.put("tensorboard2/other.txt", b"not under 'tensorboard'")
    fake.put("unmapped/ignored.txt", b"ignored")
    sync = ArtifactSync(
        api.client(),
        "job_1",
        {"artifact://tensorboard": tmp_path / "tb", "model_checkpoint_0": tmp_path / "ckpt"},
    )

    written = sync.sync()
    assert sorted(written) == sorted(
        [
            tmp_path / "tb" / "events.out",
            tmp_path / "tb" / "nested" / "blob.bin",
            tmp_path / "ckpt" / "best.pt",
        ]
    )
    assert (tmp_path / "tb" / "nested" / "blob.bin").read_bytes() == b"\x00\x01"
    assert not (tmp_path / "tb" / "other.txt").exists()
    assert sync.sync() == [] and len(fake.downloads) == 3, "unchanged: nothing fetched"

    fake.put("tensorboard/events.out", b"v1 and v2")
    assert sync.sync() == [tmp_path / "tb" / "events.out"]
    assert (tmp_path / "tb" / "events.out").read_bytes() == b"v1 and v2"


def test_the_longest_prefix_wins_and_a_file_prefix_lands_in_its_directory(
    api: MockAPI, tmp_path: Path
) -> None:
    sync = ArtifactSync(
        api.client(),
        "job_1",
        {"": tmp_path / "all", "profiler": tmp_path / "prof", "profiler/trace.json": tmp_path},
    )
    assert sync.local_path("profiler/trace.json") == tmp_path / "trace.json"
    assert sync.local_path("profiler/step/1.json") == tmp_path / "prof" / "step" / "1.json"
    assert sync.local_path("tensorboard/x") == tmp_path / "all" / "tensorboard" / "x"
    assert sync.local_path("profiler/../../etc/passwd") is None
    with pytest.raises(ValueError, match="mapping key"):
        ArtifactSync(api.client(), "job_1", {"../up": tmp_path})


def test_artifact_sync_retries_errors_on_the_next_call_instead_of_raising(
    api: MockAPI, tmp_path: Path
) -> None:
    fake = FakeArtifacts(api)
    fake.put("tensorboard/events.out", b"data")
    fake.fail_downloads = 1
    sync = ArtifactSync(api.client(), "job_1", {"tensorboard": tmp_path})

    assert sync.sync() == [] and len(sync.errors) == 1
    assert isinstance(sync.errors[0], ace3.NotFoundError)
    assert sync.sync() == [tmp_path / "events.out"] and sync.errors == []
    fake.fail_downloads = 1
    fake.put("tensorboard/events.out", b"data 2")
    with pytest.raises(ace3.NotFoundError):
        sync.sync(raise_errors=True)


def test_a_restarted_sync_does_not_download_files_it_already_has(
    api: MockAPI, tmp_path: Path
) -> None:
    fake = FakeArtifacts(api)
    fake.put("tensorboard/events.out", b"same")
    (tmp_path / "events.out").write_bytes(b"same")
    assert ArtifactSync(api.client(), "job_1", {"tensorboard": tmp_path}).sync() == []
    assert fake.downloads == []


def test_maybe_sync_syncs_at_most_every_interval(api: MockAPI, tmp_path: Path) -> None:
    fake = FakeArtifacts(api)
    fake.put("a.txt", b"a")
    sync = ArtifactSync(api.client(), "job_1", {"": tmp_path}, min_interval_seconds=3600)
    assert sync.maybe_sync() == [tmp_path / "a.txt"]
    fake.put("a.txt", b"a2")
    assert sync.maybe_sync() == [], "too soon"
    assert sync.sync() == [tmp_path / "a.txt"]


# -- CheckpointSync ----------------------------------------------------------------------------


class FakeCheckpoints:
    def __init__(self, api: MockAPI, job_id: str = "job_1") -> None:
        self.items: list[dict] = []
        self.content: dict[str, bytes] = {}
        self.downloads: list[str] = []
        api.route("GET", f"/v1/jobs/{job_id}/checkpoints", self.listing)
        api.route("GET", f"/v1/jobs/{job_id}/checkpoints/[^/]+/content", self.download)

    def add(self, step: int) -> None:
        data = f"weights {step}".encode()
        checkpoint_id = f"ck_{step}"
        self.content[checkpoint_id] = data
        self.items.append(
            {
                "id": checkpoint_id,
                "job_id": "job_1",
                "name": f"step-{step:08d}.pt",
                "step": step,
                "sha256": _sha(data),
                "size_bytes": len(data),
                "created_at": "2025-01-01T00:00:00Z",
            }
        )

    def listing(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": self.items})

    def download(self, request: httpx.Request) -> httpx.Response:
        checkpoint_id = request.url.path.split("/")[-2]
        self.downloads.append(checkpoint_id)
        data = self.content[checkpoint_id]
        return httpx.Response(200, content=data, headers={"x-checksum-sha256": _sha(data)})


def test_checkpoint_sync_keeps_the_newest_n_locally_and_leaves_other_files_alone(
    api: MockAPI, tmp_path: Path
) -> None:
    fake = FakeCheckpoints(api)
    (tmp_path / "notes.txt").write_text("mine")
    sync = CheckpointSync(api.client(), "job_1", tmp_path, max_checkpoints=2)
    for step in (10, 20, 30):
        fake.add(step)
    assert sorted(p.name for p in sync.sync()) == ["step-00000020.pt", "step-00000030.pt"]
    assert fake.downloads == ["ck_20", "ck_30"], "older than the newest two: never fetched"

    fake.add(40)
    assert [p.name for p in sync.sync()] == ["step-00000040.pt"]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["notes.txt", "step-00000030.pt", "step-00000040.pt"]
    assert (tmp_path / "step-00000040.pt").read_bytes() == b"weights 40"
    assert sync.local_checkpoints == [tmp_path / "step-00000030.pt", tmp_path / "step-00000040.pt"]
    assert sync.sync() == [] and len(fake.downloads) == 3


def test_checkpoint_sync_with_keep_one_never_deletes_the_newest(
    api: MockAPI, tmp_path: Path
) -> None:
    fake = FakeCheckpoints(api)
    sync = CheckpointSync(api.client(), "job_1", tmp_path, max_checkpoints=1)
    fake.add(10)
    sync.sync()
    fake.add(20)
    sync.sync()
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000020.pt"]
    with pytest.raises(ValueError, match="max_checkpoints=0"):
        CheckpointSync(api.client(), "job_1", tmp_path, max_checkpoints=0)
