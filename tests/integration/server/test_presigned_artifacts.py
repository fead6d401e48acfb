"""Presigned downloads of a job's artifacts (``ACE3_S3_PRESIGNED_DOWNLOADS``) on a real S3
server: while the job runs its artifacts change (the worker deletes a replaced version's bytes
as soon as the new row is committed), so they are streamed by the API, which re-reads a row whose
bytes vanished; once the job has ended they no longer change and are redirected (307)."""

from __future__ import annotations

import io
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobArtifact, JobState
from ace3_control.settings import Settings
from ace3_control.storage import open_store
from tests.conftest import fresh_database, insert_job
from tests.integration.server.in_process_api import add_key, serve
from tests.object_store import ObjectStore


@pytest.fixture()
def database_url() -> Iterator[str]:
    """A database of its own: the session stack's reconciler and worker would take the running
    job this test inserts for theirs (re-queue it, fail it), and end it under the test."""
    with fresh_database() as url:
        yield url


def test_running_jobs_artifacts_are_streamed_and_ended_ones_redirected(
    object_store: ObjectStore,
    database_url: str,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket = f"presigned-{secrets.token_hex(6)}"
    for name, value in object_store.env(bucket).items():
        monkeypatch.setenv(name, value)
    settings = Settings(
        data_dir=tmp_path,
        database_url=database_url,
        broker_url=redis_url,
        storage_url=f"s3://{bucket}/ace3",
        s3_endpoint_url=object_store.endpoint_url,
        s3_presigned_downloads=True,
    )
    data = b"step,loss\n1,0.5\n"
    blob = open_store(settings).put_stream(
        f"job-artifacts/t/{secrets.token_hex(8)}", io.BytesIO(data)
    )
    engine = make_sync_engine(database_url)
    sessions = sync_session_factory(engine)
    with sessions() as session:
        job: Job = insert_job(session, state=JobState.RUNNING, attempt=1)
        key, _ = add_key(session, job.owner_id)
        session.add(
            JobArtifact(job_id=job.id, path="metrics.csv", attempt=1, version=1,
                        size_bytes=blob.size_bytes, sha256=blob.sha256, storage_key=blob.key)
        )  # fmt: skip
        session.commit()
    url = f"/v1/jobs/{job.id}/artifacts/metrics.csv"
    try:
        with (
            serve(settings) as (_, base_url),
            httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}) as client,
        ):
            running = client.get(url, follow_redirects=False)
            assert running.status_code == 200 and running.content == data
            with sessions() as session:
                session.execute(
                    update(Job).where(Job.id == job.id).values(state=JobState.SUCCEEDED)
                )
                session.commit()
            ended = client.get(url, follow_redirects=False)
            assert ended.status_code == 307, ended.text
            assert ended.headers["location"].startswith(object_store.endpoint_url)
            assert httpx.get(ended.headers["location"]).content == data
    finally:
        engine.dispose()
