"""Webhooks over the API: ``client.webhooks``, whose methods are the REST calls of
``docs/api.md`` ("Webhooks"). Verify what a webhook receives with
:func:`ace3.webhooks.verify_signature`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pydantic import Field

from ace3.client._resource import _Resource
from ace3.client.pagination import CursorPage
from ace3.client.types import _APIObject

__all__ = ["Webhook", "WebhookDelivery", "WebhookDeliveryAttempt", "Webhooks"]


class Webhook(_APIObject):
    """A registered webhook. ``secret`` is set only on the object ``create`` returns: the
    server shows it once."""

    id: str
    url: str
    events: list[str] = Field(default_factory=list)
    disabled: bool = False
    created_at: datetime | None = None
    secret: str | None = Field(default=None, repr=False)  # never in logs or tracebacks


class WebhookDeliveryAttempt(_APIObject):
    attempt: int
    at: datetime | None = None
    status_code: int | None = None
    error: str | None = None
    duration_ms: float | None = None


class WebhookDelivery(_APIObject):
    """One event for one webhook: ``state`` is pending, delivered or failed; ``history`` has
    one entry per POST."""

    id: str
    webhook_id: str
    event_type: str
    payload: dict[str, Any] = Field(default_factory=dict)
    state: str
    attempts: int = 0
    next_attempt_at: datetime | None = None
    last_status_code: int | None = None
    last_error: str | None = None
    last_duration_ms: float | None = None
    history: list[WebhookDeliveryAttempt] = Field(default_factory=list)
    created_at: datetime | None = None
    delivered_at: datetime | None = None


class Webhooks(_Resource):
    _path = "/v1/webhooks"

    def create(self, url: str, events: Iterable[str]) -> Webhook:
        """Register ``url`` for ``events`` (``job.succeeded``, ``search.*``, ...). Keep the
        returned ``secret``: no later call shows it."""
        body = {"url": url, "events": list(events)}
        response = self._http.request("POST", self._path, json_body=body)
        return Webhook.model_validate(response.json())

    def list(self, *, limit: int | None = None, cursor: str | None = None) -> CursorPage[Webhook]:
        return self._list(self._path, Webhook, {"limit": limit}, cursor)

    def get(self, webhook_id: str) -> Webhook:
        response = self._http.request("GET", f"{self._path}/{webhook_id}")
        return Webhook.model_validate(response.json())

    retrieve = get

    def delete(self, webhook_id: str) -> None:
        self._http.request("DELETE", f"{self._path}/{webhook_id}")

    def deliveries(
        self, webhook_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> CursorPage[WebhookDelivery]:
        """The webhook's delivery log, newest first."""
        path = f"{self._path}/{webhook_id}/deliveries"
        return self._list(path, WebhookDelivery, {"limit": limit}, cursor)

    def test(self, webhook_id: str) -> WebhookDelivery:
        """Queue a ``ping`` delivery to the webhook. :class:`ace3.errors.ConflictError` (409)
        while an earlier ping to it is still pending."""
        response = self._http.request("POST", f"{self._path}/{webhook_id}/test")
        return WebhookDelivery.model_validate(response.json())
