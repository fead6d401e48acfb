"""GET /metrics in process on SQLite: the token, route templates (never raw ids), and the
database-derived histograms computed from the jobs' timestamps."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import JobMetric, JobState, utcnow
from ace3_control.settings import Settings
from ace3_server.app import create_app
from ace3_server.migrations_check import upgrade
from ace3_server.services.keys import create_key
from tests.conftest import REPO_ROOT, insert_job

TOKEN = "scrape-secret"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """One migrated SQLite database for the module: a finished job with two metric points
    (queued 7 s before it started, first metric 3 s after) and a queued job."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("metrics"), metrics_token=SecretStr(TOKEN))
    upgrade(settings.resolved_database_url)
    engine = make_sync_engine(settings.resolved_database_url)
    now = utcnow()
    with sync_session_factory(engine)() as session:
        started = now - timedelta(seconds=100)
        job = insert_job(
            session,
            state=JobState.SUCCEEDED,
            queued_at=started - timedelta(seconds=7),
            started_at=started,
            name="secret-job-name",
        )
        session.add_all(
            [
                JobMetric(job_id=job.id, step=s, name="loss", value=1.0, created_at=started + d)
                for s, d in ((1, timedelta(seconds=3)), (2, timedelta(seconds=9)))
            ]
        )
        insert_job(session, state=JobState.QUEUED)
        session.commit()
    engine.dispose()
    return settings


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, run_background_loops=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as started:
            yield started


async def test_metrics_needs_the_token_when_one_is_set(client: httpx.AsyncClient) -> None:
    assert (await client.get("/metrics")).status_code == 401
    wrong = await client.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "ACE3_METRICS_TOKEN" in wrong.json()["detail"]
    assert (await client.get("/metrics", headers={"Authorization": TOKEN})).status_code == 401
    good = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert good.status_code == 200 and good.headers["content-type"].startswith("text/plain")


async def test_histograms_and_route_templates(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    engine = make_sync_engine(settings.resolved_database_url)
    with sync_session_factory(engine)() as session:
        key = create_key(session, "metrics")
    engine.dispose()
    auth = {"Authorization": f"Bearer {key.plaintext}"}
    for job_id in ("a" * 32, "b" * 32):
        assert (await client.get(f"/v1/jobs/{job_id}", headers=auth)).status_code == 404
    assert (await client.get("/no/such/path")).status_code == 404
    response = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    text = response.text
    got = samples(text)
    job_route = (("method", "GET"), ("route", "/v1/jobs/{job_id}"), ("status", "4xx"))
    assert got[("ace3_http_request_duration_seconds_count", job_route)] == 2
    unmatched = (("method", "GET"), ("route", "unmatched"), ("status", "4xx"))
    assert got[("ace3_http_request_duration_seconds_count", unmatched)] == 1
    assert "a" * 32 not in text and "secret-job-name" not in text and "/no/such" not in text
    assert got[("ace3_database_up", ())] == 1
    assert got[("ace3_jobs", (("state", "succeeded"),))] == 1
    assert got[("ace3_jobs", (("state", "queued"),))] == 1
    assert got[("ace3_jobs", (("state", "running"),))] == 0
    # queue wait 7 s: not in the 5 s bucket, in the 10 s one
    wait = "ace3_job_queue_wait_seconds"
    assert got[(f"{wait}_bucket", (("le", "5.0"),))] == 0
    assert got[(f"{wait}_bucket", (("le", "10.0"),))] == 1
    assert got[(f"{wait}_count", ())] == 1
    assert got[(f"{wait}_sum", ())] == pytest.approx(7, abs=0.01)
    # the first metric (step 1) came 3 s after the start
    first = "ace3_job_time_to_first_metric_seconds"
    assert got[(f"{first}_bucket", (("le", "2.0"),))] == 0
    assert got[(f"{first}_bucket", (("le", "5.0"),))] == 1
    assert got[(f"{first}_sum", ())] == pytest.approx(3, abs=0.01)
    assert got[("ace3_metric_points_ingested_total", ())] == 2
    assert got[("ace3_workers_live", ())] == 0
    assert got[("ace3_sse_streams_open", ())] == 0


async def test_the_shipped_dashboard_and_scrape_config_use_the_served_names(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    # Every declared family's sample names (labelled families may have no sample yet).
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    served = {
        family.name + suffix
        for family in text_string_to_metric_families(response.text)
        for suffix in suffixes[family.type]
    }
    dashboard = json.loads((REPO_ROOT / "deploy/grafana/ace3-dashboard.json").read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"\bace3_\w+", expr)}
    assert used and used <= served, used - served
    for family in ("ace3_jobs", "ace3_job_queue_wait_seconds_bucket", "ace3_sse_streams_open",
                   "ace3_job_time_to_first_metric_seconds_bucket", "ace3_workers_live",
                   "ace3_worker_slots_free", "ace3_metric_points_ingested_total"):  # fmt: skip
        assert family in used, family
    scrape = yaml.safe_load((REPO_ROOT / "deploy/prometheus.yml").read_text())
    [job] = scrape["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["static_configs"][0]["targets"]


async def test_a_failing_histogram_query_leaves_out_only_that_histogram(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(As a statement timeout on a huge jobs table would: the other values still come.)"""
    from sqlalchemy import func

    from ace3_server.metrics import database

    real = database.seconds_between

    def first_metric_fails(later: Any, earlier: Any, dialect: str) -> Any:
        if later is not database.Job.started_at:  # the first metric's subquery
            return func.no_such_function(later)
        return real(later, earlier, dialect)

    monkeypatch.setattr(database, "seconds_between", first_metric_fails)
    response = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    got = samples(response.text)
    assert got[("ace3_database_up", ())] == 1
    assert got[("ace3_job_queue_wait_seconds_count", ())] == 1
    assert got[("ace3_metric_points_ingested_total", ())] == 2
    assert "ace3_job_time_to_first_metric_seconds" not in response.text


async def test_labels_stay_bounded_whatever_the_client_sends(client: httpx.AsyncClient) -> None:
    """Made-up methods are ``other``; odd paths are ``unmatched`` or a route's template."""
    for method in ("FOO", "PROPFIND", "get", "X" * 40):
        await client.request(method, f"/v1/jobs/{'c' * 32}")
        await client.request(method, "/no/such/path")
    for path in ("/ui/abc/ui", "/ui/x/y", f"/v1/jobs/{'d' * 32}/nope", "/v1/jobs//x", "/v1/"):
        await client.get(path)
    response = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    labels = [
        dict(labels)
        for (name, labels) in samples(response.text)
        if name == "ace3_http_request_duration_seconds_count"
    ]
    assert {label["method"] for label in labels} == {"GET", "other"}
    assert {label["route"] for label in labels} <= {
        "unmatched", "/v1/jobs/{job_id}", "/ui/{path}", "/metrics"
    }  # fmt: skip
    assert {label["status"] for label in labels} <= {"2xx", "3xx", "4xx", "5xx"}
    assert "PROPFIND" not in response.text and "abc" not in response.text


async def test_concurrent_scrapes_share_one_database_read(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Open /metrics: 12 scrapes at once run the aggregates once; with no cache at all
    (``metrics_cache_seconds=0``) still only one read runs at a time."""
    import asyncio

    from ace3_server.metrics import endpoint

    real = endpoint.read_snapshot
    reads = running = most_running = 0

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads, running, most_running
        reads += 1
        running += 1
        most_running = max(most_running, running)
        try:
            await asyncio.sleep(0.05)  # a slow aggregate: the other scrapes arrive meanwhile
            return await real(*args, **kwargs)
        finally:
            running -= 1

    monkeypatch.setattr(endpoint, "read_snapshot", counted)
    for cache_seconds, expected_reads in ((10.0, 1), (0.0, 12)):
        reads = most_running = 0
        open_settings = settings.model_copy(
            update={"metrics_token": None, "metrics_cache_seconds": cache_seconds}
        )
        app = create_app(open_settings, run_background_loops=False)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
                responses = await asyncio.gather(*(client.get("/metrics") for _ in range(12)))
        assert (reads, most_running) == (expected_reads, 1), cache_seconds
        for response in responses:
            got = samples(response.text)
            assert got[("ace3_database_up", ())] == 1
            assert got[("ace3_jobs", (("state", "queued"),))] == 1
