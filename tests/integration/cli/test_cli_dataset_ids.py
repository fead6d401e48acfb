"""``dataset: {id: ...}`` in a job or search file, through the real CLI and API: a dataset
registered from a bucket (parquet shards on the session's SeaweedFS) is used as it is (nothing
uploaded for it), as the training and the validation dataset, by ``ace3 train`` and ``ace3
search``; an id that is not the owner's is exit code 3 naming the key, before the model is
uploaded. The API runs in process with an allow-list for the bucket; no worker runs the job."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import httpx
import pytest

from ace3.cli import main
from tests.conftest import REPO_ROOT
from tests.object_store import ObjectStore
from tests.shard_sources import parquet_bytes
from tests.sources_api import SourcesAPI, sources_api


class Setup(NamedTuple):
    source: SourcesAPI
    api: httpx.Client
    train_id: str
    val_id: str
    folder: Path


@pytest.fixture(scope="module")
def setup(
    object_store: ObjectStore, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    objects = {"cli/train/0.parquet": parquet_bytes(6), "cli/val/0.parquet": parquet_bytes(2)}
    folder = tmp_path_factory.mktemp("cli-dataset-ids")
    (folder / "model.py").write_text((REPO_ROOT / "examples/digits/model.py").read_text())
    with sources_api(object_store, redis_url, folder / "service", objects) as source:
        headers = {"Authorization": f"Bearer {source.key}"}
        with httpx.Client(base_url=source.base_url, headers=headers, timeout=60) as api:
            ids = []
            for split in ("train", "val"):
                uri = f"s3://{source.bucket}/cli/{split}/"
                response = api.post("/v1/datasets/register", json={"uri": uri, "format": "parquet"})
                assert response.status_code == 201, response.text
                ids.append(response.json()["id"])
            yield Setup(source, api, ids[0], ids[1], folder)


def _ace3(setup: Setup, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = {"ACE3_API_KEY": setup.source.key, "ACE3_BASE_URL": setup.source.base_url}
    with (
        mock.patch.dict(os.environ, env),
        contextlib.chdir(setup.folder),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def _dataset_count(setup: Setup) -> int:
    return len(setup.api.get("/v1/datasets").json()["data"])


def test_a_job_file_trains_on_registered_datasets_by_id(setup: Setup) -> None:
    (setup.folder / "job.yaml").write_text(
        f"name: on-shards\nmodel: model.py\ndataset: {{id: {setup.train_id}}}\n"
        f"validation_dataset: {{id: {setup.val_id}}}\ntraining: {{epochs: 1, batch_size: 4}}\n"
    )
    before = _dataset_count(setup)
    code, out, err = _ace3(setup, "train", "job.yaml", "--detach", "--json")
    assert code == 0, (out, err)
    job: dict[str, Any] = json.loads(out)
    assert job["dataset_id"] == setup.train_id
    assert job["validation_dataset_id"] == setup.val_id
    assert job["state"] == "queued" and job["name"] == "on-shards"
    assert _dataset_count(setup) == before  # nothing uploaded for them

    # An override names another stored dataset (the uploaded .npz of the same owner).
    code, out, err = _ace3(
        setup, "train", "job.yaml", f"validation_dataset.id={setup.source.uploaded_id}",
        "--detach", "--json",
    )  # fmt: skip
    assert code == 0, (out, err)
    assert json.loads(out)["validation_dataset_id"] == setup.source.uploaded_id


def test_a_search_file_names_them_by_id_too(setup: Setup) -> None:
    (setup.folder / "search.yaml").write_text(
        f"model: model.py\ndataset: {{id: {setup.train_id}}}\n"
        f"validation_dataset: {{id: {setup.val_id}}}\ntraining: {{epochs: 1}}\n"
        "search:\n  algorithm: random\n  max_trials: 2\n  objective: val_loss\n"
        "  direction: minimize\n  search_space:\n"
        "    learning_rate: {type: loguniform, low: 1.0e-4, high: 1.0e-2}\n"
    )
    code, out, err = _ace3(setup, "search", "search.yaml", "--detach", "--json")
    assert code == 0, (out, err)
    search = json.loads(out)
    assert search["dataset_id"] == setup.train_id
    assert search["validation_dataset_id"] == setup.val_id


def test_an_unknown_id_is_not_found_before_anything_is_uploaded(setup: Setup) -> None:
    (setup.folder / "other.yaml").write_text(
        "model: model.py\ndataset: {id: 0123456789abcdef0123456789abcdef}\ntraining: {epochs: 1}\n"
    )
    models = setup.api.get("/v1/models").json()["data"]
    code, out, err = _ace3(setup, "train", "other.yaml", "--detach")
    assert code == 3, (out, err)
    assert "dataset.id: no dataset 0123456789abcdef0123456789abcdef among yours" in err
    assert setup.api.get("/v1/models").json()["data"] == models
