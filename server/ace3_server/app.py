"""The FastAPI application: wiring settings, database, storage, the publisher and the reconciler."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI
from sqlalchemy import text
from sqlalchemy.engine import make_url

from ace3_control.db import async_session_factory, make_async_engine
from ace3_control.settings import Settings, get_settings
from ace3_control.storage import open_store
from ace3_server import __version__
from ace3_server.api.error_handlers import install_error_handlers
from ace3_server.api.routes.artifacts import datasets_router, models_router
from ace3_server.api.routes.checkpoints import router as checkpoints_router
from ace3_server.api.routes.dataset_shards import router as dataset_shards_router
from ace3_server.api.routes.environments import router as environments_router
from ace3_server.api.routes.jobs import router as jobs_router
from ace3_server.api.routes.queue import router as queue_router
from ace3_server.api.routes.searches import router as searches_router
from ace3_server.api.routes.webhooks import router as webhooks_router
from ace3_server.api.routes.workers import router as workers_router
from ace3_server.api.routing import error_responses
from ace3_server.key_cache import KeyCache
from ace3_server.metrics.cache import SnapshotCache
from ace3_server.metrics.endpoint import router as metrics_router
from ace3_server.metrics.http import HttpMetrics, MetricsMiddleware
from ace3_server.middleware import RequestIdMiddleware, UploadGuardMiddleware
from ace3_server.migrations_check import ensure_migrated
from ace3_server.openai_api.router import openai_router
from ace3_server.reconciler import run_reconciler
from ace3_server.retention import run_retention
from ace3_server.searches.driver import DriverWakes, run_search_driver
from ace3_server.services import events
from ace3_server.services.publishing import PublishQueue
from ace3_server.services.stream_listener import run_stream_listener
from ace3_server.services.stream_wake import StreamHub
from ace3_server.ui import install_ui
from ace3_server.webhooks.delivery import run_webhook_deliveries

API_APPLICATION_NAME = "ace3-api"
"""How the API's database connections name themselves (Postgres ``pg_stat_activity``)."""


def _stream_hub(settings: Settings) -> StreamHub | None:
    """The hub that wakes live streams on Postgres notifications; None where they poll
    (SQLite, or ACE3_STREAM_WAKE=poll)."""
    if settings.stream_wake != "notify":
        return None
    if make_url(settings.resolved_database_url).get_backend_name() != "postgresql":
        return None
    return StreamHub()


def create_app(settings: Settings | None = None, *, run_background_loops: bool = True) -> FastAPI:
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ensure_migrated(settings.resolved_database_url)
        engine = make_async_engine(
            settings.resolved_database_url, application_name=API_APPLICATION_NAME
        )
        app.state.settings = settings
        app.state.session_factory = async_session_factory(engine)
        app.state.store = open_store(settings)
        # Publishes never wait on the broker in a request (services/publishing.py).
        app.state.publisher = PublishQueue.from_settings(settings)
        app.state.key_cache = KeyCache(settings.api_key_cache_seconds)
        hub = _stream_hub(settings)
        app.state.stream_wakes = events.Wakes(hub, settings.stream_safety_poll_seconds)
        app.state.search_driver = DriverWakes(app.state.session_factory, hub)
        loops = []
        if hub is not None:
            loops.append(
                asyncio.create_task(run_stream_listener(settings.resolved_database_url, hub))
            )
        if run_background_loops:
            loops += [
                asyncio.create_task(loop(app.state.session_factory, app.state.publisher, settings))
                for loop in (run_reconciler, run_webhook_deliveries)
            ]
            loops.append(
                asyncio.create_task(
                    run_search_driver(
                        app.state.session_factory,
                        app.state.publisher,
                        settings,
                        app.state.search_driver,
                    )
                )
            )
            if settings.log_retention_days or settings.metric_retention_days:
                store = app.state.store
                loops.append(
                    asyncio.create_task(run_retention(app.state.session_factory, store, settings))
                )
        try:
            yield
        finally:
            for task in loops:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            app.state.publisher.close()
            await engine.dispose()

    app = FastAPI(
        title="ACE3",
        version=__version__,
        summary="Training as a service for PyTorch",
        lifespan=lifespan,
    )
    v1 = APIRouter(prefix="/v1")
    v1.include_router(models_router)
    v1.include_router(datasets_router)
    v1.include_router(dataset_shards_router)
    v1.include_router(jobs_router)
    v1.include_router(checkpoints_router)
    v1.include_router(searches_router)
    v1.include_router(workers_router)
    v1.include_router(environments_router)
    v1.include_router(queue_router)
    v1.include_router(webhooks_router)
    app.include_router(v1)
    app.include_router(openai_router())
    app.include_router(metrics_router)
    app.state.http_metrics = HttpMetrics()
    app.state.metrics_snapshots = SnapshotCache(settings.metrics_cache_seconds)

    @app.get("/healthz", tags=["health"], operation_id="health", responses=error_responses(503))
    async def health() -> dict[str, str]:
        async with app.state.session_factory() as session:
            await session.execute(text("SELECT 1"))
        return {"status": "ok", "version": __version__}

    install_ui(app)
    install_error_handlers(app)
    app.add_middleware(UploadGuardMiddleware, max_upload_bytes=settings.max_upload_bytes)
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=app.state.http_metrics)
    return app
