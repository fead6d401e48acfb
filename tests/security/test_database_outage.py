"""With the database gone the API answers a JSON 503 with Retry-After on every route, /healthz
and uploads included, and a live stream ends cleanly instead of failing mid-response.

The app talks to Postgres through a TCP proxy that the test closes: the shared database keeps
running, the app loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import make_url

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.settings import Settings
from ace3_server.app import create_app
from ace3_server.services.keys import create_key
from tests.security.conftest import finish_job, insert_running_job


class TcpProxy:
    """Forwards a local port to ``target`` until :meth:`close`, which drops every connection
    and refuses new ones."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = int(self.listener.getsockname()[1])
        self.open_sockets: list[socket.socket] = []
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.open_sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        for end in self.open_sockets:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            end.close()


@pytest.fixture
def proxy(database_url: str) -> Iterator[TcpProxy]:
    url = make_url(database_url)
    forwarding = TcpProxy((url.host or "127.0.0.1", url.port or 5432))
    yield forwarding
    forwarding.close()


@pytest.fixture
def owner(database_url: str) -> tuple[str, str]:
    """(API key, owner id), made in the database directly."""
    engine = make_sync_engine(database_url, pooled=False)
    try:
        with sync_session_factory(engine)() as session:
            created = create_key(session, "outage")
        return created.plaintext, created.owner_id
    finally:
        engine.dispose()


@pytest.fixture
async def client(
    database_url: str, proxy: TcpProxy, tmp_path: Path, owner: tuple[str, str]
) -> AsyncIterator[httpx.AsyncClient]:
    """The app, started (migrations checked) through the proxy, and a client of it."""
    proxied = make_url(database_url).set(host="127.0.0.1", port=proxy.port)
    settings = Settings(
        data_dir=tmp_path, database_url=proxied.render_as_string(hide_password=False)
    )
    app = create_app(settings, run_background_loops=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {owner[0]}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://api", headers=headers
        ) as started:
            yield started


def _assert_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/json"
    assert int(response.headers["retry-after"]) > 0
    assert "database is unavailable" in response.json()["detail"]


async def test_every_route_answers_a_json_503_while_the_database_is_gone(
    client: httpx.AsyncClient, proxy: TcpProxy
) -> None:
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/v1/jobs")).status_code == 200
    proxy.close()
    _assert_unavailable(await client.get("/healthz"))
    _assert_unavailable(await client.get("/v1/jobs"))
    _assert_unavailable(await client.get("/v1/jobs/some-job/events"))
    upload = {"file": ("m.py", b"def build_model():\n    pass\n")}
    _assert_unavailable(await client.post("/v1/models", files=upload))
    body = {"model_id": "m", "dataset_id": "d"}
    _assert_unavailable(await client.post("/v1/jobs", json=body))
    # /metrics still answers: this process's own metrics, and that the database is gone.
    metrics = await client.get("/metrics")
    assert metrics.status_code == 200 and "ace3_database_up 0.0" in metrics.text
    assert "ace3_http_request_duration_seconds_count" in metrics.text


async def test_a_live_stream_ends_cleanly_when_the_database_goes(
    client: httpx.AsyncClient, proxy: TcpProxy, database_url: str, owner: tuple[str, str]
) -> None:
    job_id = insert_running_job(database_url, owner[1], metrics=1)
    try:
        stream = asyncio.create_task(client.get(f"/v1/jobs/{job_id}/events"))
        await asyncio.sleep(1.0)  # a few polls
        proxy.close()
        response = await asyncio.wait_for(stream, timeout=15)
    finally:
        finish_job(database_url, job_id)
    assert response.status_code == 200
    assert "event: metric" in response.text
    assert response.text.endswith("retry: 5000\n\n")
