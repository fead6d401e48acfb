"""The dashboard's Datasets pages in a real browser: a dataset registered from a bucket (tiny
parquet shards on the session's SeaweedFS) and an uploaded one in the list (name, kind, format,
shards, size, samples), the registered one's page (id, uri, format, shards, bytes, samples,
sha256), and a job's page linking its datasets there. The API is the real app in process, on a
database of its own with an allow-list for the bucket (the shared stack has none); no worker
reads its queue, so the job stays queued."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from tests.object_store import ObjectStore
from tests.shard_sources import parquet_bytes
from tests.sources_api import sources_api

pytestmark = pytest.mark.slow  # a browser and a database of its own

MORE = 48  # with the module's 3 others, one more dataset than the list's page of 50


class Registered(NamedTuple):
    base_url: str
    key: str
    uri: str
    remote: dict[str, Any]  # the registered dataset (GET /v1/datasets/{id})
    validation: dict[str, Any]  # another registered one, the job's validation dataset
    uploaded_id: str  # an uploaded .npz dataset of the same owner
    job_id: str


@pytest.fixture(scope="module")
def registered(
    object_store: ObjectStore, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Registered]:
    objects = {
        "corpus/train/0.parquet": parquet_bytes(4),
        "corpus/train/1.parquet": parquet_bytes(3),
        "corpus/val/0.parquet": parquet_bytes(2),
        # Prefixes the paging test registers, a dataset each (the same shards under one
        # prefix would be the same dataset).
        **{f"more/{number:02d}/0.parquet": parquet_bytes(1) for number in range(MORE)},
    }
    folder = tmp_path_factory.mktemp("ui-datasets")
    with sources_api(object_store, redis_url, folder, objects) as source:
        headers = {"Authorization": f"Bearer {source.key}"}
        with httpx.Client(base_url=source.base_url, headers=headers, timeout=60) as api:
            uri = f"s3://{source.bucket}/corpus/train/"
            train = api.post(
                "/v1/datasets/register", json={"uri": uri, "format": "parquet", "name": "corpus"}
            )
            assert train.status_code == 201, train.text
            val_uri = f"s3://{source.bucket}/corpus/val/"
            val = api.post("/v1/datasets/register", json={"uri": val_uri, "format": "parquet"})
            assert val.status_code == 201, val.text
            job = {
                "model_id": source.model_id,
                "dataset_id": train.json()["id"],
                "validation_dataset_id": val.json()["id"],
                "config": {"epochs": 1},
                "name": "ui-on-shards",
            }
            submitted = api.post("/v1/jobs", json=job)
            assert submitted.status_code == 201, submitted.text
            remote = api.get(f"/v1/datasets/{train.json()['id']}").json()
        yield Registered(
            source.base_url, source.key, uri, remote, val.json(), source.uploaded_id,
            submitted.json()["id"],
        )  # fmt: skip


def _sign_in(page: Any, registered: Registered, hash_route: str) -> None:
    page.goto(f"{registered.base_url}/ui/{hash_route}")
    page.fill("#api-key", registered.key)
    page.click("#sign-in button[type=submit]")
    page.wait_for_selector("#nav:not([hidden])")


def test_the_datasets_list_the_registered_page_and_the_jobs_link(
    page: Any, registered: Registered, tmp_path: Path
) -> None:
    remote = registered.remote
    assert remote["kind"] == "remote" and remote["shard_count"] == 2 and remote["samples"] == 7
    _sign_in(page, registered, "#/datasets")
    assert page.locator("nav a.active").get_attribute("data-nav") == "datasets"
    row = page.locator(f"tr[data-dataset-id='{remote['id']}']")
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[:4] == ["corpus", "remote", "parquet", "2"]
    assert cells[4].endswith(("B", "KiB")) and cells[5] == "7" and cells[6]
    uploaded = page.locator(f"tr[data-dataset-id='{registered.uploaded_id}'] td").all_inner_texts()
    assert uploaded[1:4] == ["file", "npz", "\u2014"]  # not sharded: no shard count
    assert page.locator("tbody tr").count() == 3
    page.screenshot(path=str(tmp_path / "datasets.png"), full_page=True)

    row.locator("a").click()
    page.wait_for_url(f"**#/datasets/{remote['id']}")
    fields = page.locator("#dataset-fields")
    fields.wait_for()

    def field(name: str) -> str:
        text: str = fields.locator(f"tr[data-field='{name}'] td").inner_text()
        return text

    assert page.locator("#dataset-name").inner_text() == "corpus"
    assert field("id") == remote["id"]
    assert field("kind") == "remote" and field("format") == "parquet"
    assert field("uri") == registered.uri
    assert field("shard_count") == "2" and field("samples") == "7"
    assert field("size_bytes").startswith(f"{remote['size_bytes']} (")
    assert field("sha256") == remote["sha256"]
    page.screenshot(path=str(tmp_path / "dataset.png"), full_page=True)

    # The job's page links its datasets to their pages.
    page.goto(f"{registered.base_url}/ui/#/jobs/{registered.job_id}")
    link = page.locator("#job-dataset a")
    link.wait_for()
    assert link.inner_text() == remote["id"]
    validation_link = page.locator("#job-validation-dataset a")
    assert validation_link.get_attribute("href") == f"#/datasets/{registered.validation['id']}"
    page.screenshot(path=str(tmp_path / "job.png"), full_page=True)
    link.click()
    page.wait_for_url(f"**#/datasets/{remote['id']}")
    page.locator("#dataset-fields").wait_for()
    assert page.page_errors == [] and page.console_errors == []


def test_an_id_not_among_the_owners_datasets_has_no_page(page: Any, registered: Registered) -> None:
    _sign_in(page, registered, f"#/datasets/{secrets.token_hex(16)}")
    page.wait_for_selector("text=Dataset not found")
    assert page.page_errors == []


def test_the_list_pages_older_and_newer_with_the_api_s_cursors(
    page: Any, registered: Registered
) -> None:
    """(Last in this module: it adds datasets.) 51 datasets: page 1 shows the newest 50, Older
    the oldest one alone, Newer the first page again."""
    headers = {"Authorization": f"Bearer {registered.key}"}
    bucket = registered.uri.removeprefix("s3://").split("/")[0]
    with httpx.Client(base_url=registered.base_url, headers=headers, timeout=60) as api:
        for number in range(MORE):
            uri = f"s3://{bucket}/more/{number:02d}/"
            added = api.post("/v1/datasets/register", json={"uri": uri, "format": "parquet"})
            assert added.status_code == 201, added.text
        listed = api.get("/v1/datasets", params={"limit": 100}).json()["data"]
    assert len(listed) == 51
    oldest = listed[-1]
    _sign_in(page, registered, "#/datasets")
    page.locator("tr[data-dataset-id]").first.wait_for()
    assert page.locator("tbody tr").count() == 50
    pager = page.locator(".pager")
    assert pager.locator("span").inner_text() == "page 1"
    assert pager.locator("button", has_text="Newer").is_disabled()
    pager.locator("button", has_text="Older").click()
    page.locator(f"tr[data-dataset-id='{oldest['id']}']").wait_for()
    assert page.locator("tbody tr").count() == 1
    assert pager.locator("span").inner_text() == "page 2"
    assert pager.locator("button", has_text="Older").is_disabled()
    pager.locator("button", has_text="Newer").click()
    page.locator("tr[data-dataset-id='" + registered.remote["id"] + "']").wait_for()
    assert page.locator("tbody tr").count() == 50
    assert pager.locator("span").inner_text() == "page 1"
    assert page.page_errors == [] and page.console_errors == []
