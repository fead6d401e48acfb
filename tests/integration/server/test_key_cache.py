"""A revoked key stops working within ACE3_API_KEY_CACHE_SECONDS in a process that had
verified it (and at once with the cache off); an unknown key is never cached."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import ApiKey, Job, utcnow
from ace3_control.settings import Settings
from ace3_server.auth import hash_key
from tests.conftest import insert_job
from tests.integration.server.in_process_api import add_key, serve

TTL_SECONDS = 3.0


@pytest.fixture(scope="module")
def session_factory(database_url: str) -> Iterator[Any]:
    engine = make_sync_engine(database_url)
    yield sync_session_factory(engine)
    engine.dispose()


def _settings(database_url: str, redis_url: str, tmp: Any, ttl: float) -> Settings:
    return Settings(
        data_dir=tmp, database_url=database_url, broker_url=redis_url, api_key_cache_seconds=ttl
    )


def _revoke(session_factory: Any, key_id: str) -> None:
    with session_factory() as session:
        session.get(ApiKey, key_id).revoked_at = utcnow()
        session.commit()


def test_a_revoked_key_is_refused_within_the_cache_ttl(
    database_url: str, redis_url: str, tmp_path: Any, session_factory: Any
) -> None:
    with session_factory() as session:
        job: Job = insert_job(session, state="queued")
        cached, cached_id = add_key(session, job.owner_id)
        uncached, uncached_id = add_key(session, job.owner_id)
    with (
        serve(_settings(database_url, redis_url, tmp_path / "a", TTL_SECONDS)) as (app, with_cache),
        serve(_settings(database_url, redis_url, tmp_path / "b", 0)) as (_, without_cache),
    ):

        def get(base_url: str, key: str) -> int:
            headers = {"Authorization": f"Bearer {key}"}
            return httpx.get(f"{base_url}/v1/jobs/{job.id}", headers=headers).status_code

        assert get(with_cache, cached) == 200
        assert app.state.key_cache.owner(hash_key(cached)) == job.owner_id
        assert get(without_cache, uncached) == 200
        _revoke(session_factory, cached_id)
        _revoke(session_factory, uncached_id)
        revoked = time.monotonic()
        assert get(without_cache, uncached) == 401  # (no cache: at once)
        while get(with_cache, cached) == 200:
            assert time.monotonic() - revoked < TTL_SECONDS + 1, "still trusted after the ttl"
            time.sleep(0.1)
        unknown = "ace3_0123456789ab_unknown"
        assert get(with_cache, unknown) == 401
        assert app.state.key_cache.owner(hash_key(unknown)) is None
