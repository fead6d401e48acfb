"""The real API in process on a database of its own, allowed to read one bucket of the
session's SeaweedFS (``ACE3_DATASET_SOURCES``, which the shared stack does not set), for tests
that register datasets from it: its owner has a key, a model and an uploaded ``.npz`` dataset
(rows only), and no worker reads its queue (a job stays queued)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.settings import Settings
from tests.conftest import fresh_database, insert_job
from tests.integration.server.in_process_api import add_key, serve
from tests.object_store import ObjectStore
from tests.shard_sources import new_bucket, put, s3_client, source_credentials


class SourcesAPI(NamedTuple):
    base_url: str
    key: str  # the owner's API key
    bucket: str  # allowed as a whole: s3://<bucket>/
    model_id: str
    uploaded_id: str  # an uploaded .npz dataset (kind file)


@contextmanager
def sources_api(
    store: ObjectStore, redis_url: str, data_dir: Path, objects: dict[str, bytes]
) -> Iterator[SourcesAPI]:
    """The API while it runs, with ``objects`` (key -> bytes) in a new bucket it may read."""
    s3 = s3_client(store)
    bucket = new_bucket(s3, "api-sources")
    put(s3, bucket, objects)
    with fresh_database() as database_url, source_credentials(store):
        engine = make_sync_engine(database_url)
        with sync_session_factory(engine)() as session:
            job = insert_job(session, state="cancelled")  # an owner with a model and an .npz
            key, _ = add_key(session, job.owner_id)
            model_id, uploaded_id = job.model_id, job.dataset_id
        engine.dispose()
        settings = Settings(
            data_dir=data_dir,
            database_url=database_url,
            broker_url=redis_url,
            queue_name=f"ace3-sources-{secrets.token_hex(4)}",  # no worker reads it
            s3_endpoint_url=store.endpoint_url,
            dataset_sources=f"s3://{bucket}/",
        )
        with serve(settings) as (_, base_url):
            yield SourcesAPI(base_url, key, bucket, model_id, uploaded_id)
