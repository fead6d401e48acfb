"""``GET /metrics``: this process's HTTP metrics and the database's cluster-wide metrics, in
Prometheus' text format; behind a bearer token when ``ACE3_METRICS_TOKEN`` is set. The database
part is read at most once per ``ACE3_METRICS_CACHE_SECONDS`` by this process
(:class:`~ace3_server.metrics.cache.SnapshotCache`)."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ace3_server.metrics.cache import SnapshotCache
from ace3_server.metrics.collector import DatabaseCollector
from ace3_server.metrics.database import read_snapshot
from ace3_server.metrics.http import HttpMetrics

router = APIRouter()


def token_accepted(expected: str | None, authorization: str | None) -> bool:
    if expected is None:
        return True
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), expected.encode()
    )


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    settings = request.app.state.settings
    expected = settings.metrics_token.get_secret_value() if settings.metrics_token else None
    if not token_accepted(expected, request.headers.get("authorization")):
        return JSONResponse(
            {"detail": "GET /metrics needs 'Authorization: Bearer <ACE3_METRICS_TOKEN>'"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    snapshots: SnapshotCache = request.app.state.metrics_snapshots
    snapshot = await snapshots.get(
        lambda: read_snapshot(request.app.state.session_factory, settings)
    )
    database = CollectorRegistry(auto_describe=False)
    database.register(DatabaseCollector(snapshot))
    http: HttpMetrics = request.app.state.http_metrics
    body = generate_latest(http.registry) + generate_latest(database)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
