"""The web dashboard: static files served at ``/ui/``, a client of ``/v1`` like the SDK and the CLI.

Nothing here reads the database: the page signs in with an API key (kept in the browser's
session storage, sent as a bearer header) and calls the same REST routes, so it sees exactly
what the key's owner may see.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import Message, Receive, Scope, Send

STATIC_DIR = Path(__file__).parent / "static"

# Only this origin's scripts and connections; no inline scripts, no framing, no referrer (the
# hash route holds ids, never the key, but nothing of the page needs to leave it).
UI_HEADERS = {
    b"content-security-policy": (
        b"default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        b"img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; "
        b"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    b"x-content-type-options": b"nosniff",
    b"referrer-policy": b"no-referrer",
    b"x-frame-options": b"DENY",
    b"cache-control": b"no-cache",
}


class _UiFiles(StaticFiles):
    """The dashboard's files with its security headers on every response."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (name, value)
                    for name, value in message.get("headers", [])
                    if name.lower() not in UI_HEADERS
                ]
                message["headers"] = [*headers, *UI_HEADERS.items()]
            await send(message)

        await super().__call__(scope, receive, send_with_headers)


def install_ui(app: FastAPI) -> None:
    """Serve the dashboard at ``/ui/`` (``/ui`` redirects there)."""

    @app.get("/ui", include_in_schema=False)
    async def ui_root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=308)

    app.mount("/ui", _UiFiles(directory=STATIC_DIR, html=True), name="ui")
