"""Per-process HTTP metrics: request latency by route template, and open event streams.

A pure ASGI middleware (nothing is buffered: streamed responses pass through as they are
sent). Every label has a bounded set of values, whatever a client sends: the route label is
the matched route's template (``/v1/jobs/{job_id}``), never the raw path, so ids never become
label values, and requests no route matched are ``unmatched``; the method is one of
:data:`METHODS` or ``other``; the status is its class (``2xx``). Responses
sent as ``text/event-stream`` are long by design: they are counted as open streams (a gauge)
and as opened streams, not observed as request latency.
"""

from __future__ import annotations

import re
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
UNMATCHED_ROUTE = "unmatched"
METHODS = frozenset(("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"))
OTHER = "other"
_PARAM = re.compile(r"{(\w+)}")
EVENT_STREAM = b"text/event-stream"


class HttpMetrics:
    """The per-process metrics of one app, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.request_seconds = Histogram(
            "ace3_http_request_duration_seconds",
            "Time from a request's arrival to the end of its response, by route template, "
            "method and status class (event streams excluded; this API process only).",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.open_streams = Gauge(
            "ace3_sse_streams_open",
            "Server-sent event streams this API process is sending now.",
            registry=self.registry,
        )
        self.streams_opened = Counter(
            "ace3_sse_streams_opened",
            "Server-sent event streams this API process started, by route template.",
            ["route"],
            registry=self.registry,
        )


def route_template(scope: Scope) -> str:
    """The full template of the route that served ``scope`` (``/v1/jobs/{job_id}``).

    The matched route's own template may lack the prefixes of the routers it was included
    through (``/jobs/{job_id}``): they are the part of the path before what the route matched.
    """
    template = getattr(scope.get("route"), "path_format", None)
    if not isinstance(template, str) or not template:
        return UNMATCHED_ROUTE
    params = scope.get("path_params") or {}
    rendered = _PARAM.sub(lambda m: str(params.get(m.group(1), m.group(0))), template)
    path = scope.get("path", "")
    if path.endswith(rendered):
        return path[: len(path) - len(rendered)] + template
    return template


def method_label(method: object) -> str:
    """The request's method if it is a standard one, else ``other`` (``PROPFIND``, ``FOO``)."""
    return method if isinstance(method, str) and method in METHODS else OTHER


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 100 <= status <= 599 else OTHER


def _is_event_stream(message: Message) -> bool:
    for name, value in message.get("headers") or []:
        if name.lower() == b"content-type":
            return bytes(value).split(b";", 1)[0].strip().lower() == EVENT_STREAM
    return False


class MetricsMiddleware:
    """Observes every HTTP request into :class:`HttpMetrics` without touching its body."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        streaming = False

        async def observing_send(message: Message) -> None:
            nonlocal status, streaming
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if _is_event_stream(message):
                    streaming = True
                    self.metrics.open_streams.inc()
                    self.metrics.streams_opened.labels(route_template(scope)).inc()
            await send(message)

        try:
            await self.app(scope, receive, observing_send)
        finally:
            if streaming:
                self.metrics.open_streams.dec()
            else:
                self.metrics.request_seconds.labels(
                    route_template(scope), method_label(scope.get("method")), status_class(status)
                ).observe(time.perf_counter() - started)
