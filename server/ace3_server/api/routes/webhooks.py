"""Webhooks: register a URL for job and search state changes, list, read, delete, test, and
read each webhook's delivery log. See docs/api.md ("Webhooks")."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Response
from sqlalchemy import select

from ace3_control.models import Webhook, WebhookDelivery
from ace3_server.api.deps import OwnerDep, SessionDep, SettingsDep
from ace3_server.api.params import PageCursor, StoredText
from ace3_server.api.routing import error_responses, resource_router
from ace3_server.schemas import Page
from ace3_server.services.pagination import paginate
from ace3_server.webhooks import service
from ace3_server.webhooks.schemas import (
    WebhookCreate,
    WebhookCreated,
    WebhookDeliveryOut,
    WebhookOut,
)

router = resource_router("/webhooks", "webhooks")
NOT_FOUND = error_responses(404)
Limit = Annotated[int, Query(ge=1, le=200)]


@router.post(
    "",
    response_model=WebhookCreated,
    status_code=201,
    operation_id="create_webhook",
    responses=error_responses(400),
)
async def create_webhook(
    body: WebhookCreate, session: SessionDep, owner_id: OwnerDep, settings: SettingsDep
) -> WebhookCreated:
    """The answer holds the signing ``secret``: the only time it is shown."""
    webhook = await service.create_webhook(session, owner_id, body, settings)
    return WebhookCreated.model_validate(webhook)


@router.get("", response_model=Page[WebhookOut], operation_id="list_webhooks")
async def list_webhooks(
    session: SessionDep, owner_id: OwnerDep, limit: Limit = 50, cursor: PageCursor = None
) -> dict[str, object]:
    stmt = select(Webhook).where(Webhook.owner_id == owner_id)
    rows, next_cursor = await paginate(
        session, stmt, Webhook, owner_id=owner_id, cursor=cursor, limit=limit
    )
    return {"data": rows, "next_cursor": next_cursor}


@router.get(
    "/{webhook_id}", response_model=WebhookOut, operation_id="get_webhook", responses=NOT_FOUND
)
async def get_webhook(webhook_id: StoredText, session: SessionDep, owner_id: OwnerDep) -> Webhook:
    return await service.get_owned_webhook(session, owner_id, webhook_id)


@router.delete("/{webhook_id}", status_code=204, operation_id="delete_webhook", responses=NOT_FOUND)
async def delete_webhook(
    webhook_id: StoredText, session: SessionDep, owner_id: OwnerDep
) -> Response:
    """Stops deliveries at once; its delivery log goes with it."""
    webhook = await service.get_owned_webhook(session, owner_id, webhook_id)
    await session.delete(webhook)
    await session.commit()
    return Response(status_code=204)


@router.get(
    "/{webhook_id}/deliveries",
    response_model=Page[WebhookDeliveryOut],
    operation_id="list_webhook_deliveries",
    responses=NOT_FOUND,
)
async def list_deliveries(
    webhook_id: StoredText,
    session: SessionDep,
    owner_id: OwnerDep,
    limit: Limit = 50,
    cursor: PageCursor = None,
) -> dict[str, object]:
    """Newest first: each delivery's state, attempts and the outcome of every attempt."""
    await service.get_owned_webhook(session, owner_id, webhook_id)
    stmt = select(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id)
    rows, next_cursor = await paginate(
        session, stmt, WebhookDelivery, owner_id=owner_id, cursor=cursor, limit=limit
    )
    return {"data": rows, "next_cursor": next_cursor}


@router.post(
    "/{webhook_id}/test",
    response_model=WebhookDeliveryOut,
    status_code=202,
    operation_id="test_webhook",
    responses=error_responses(404, 409),
)
async def test_webhook(
    webhook_id: StoredText, session: SessionDep, owner_id: OwnerDep
) -> WebhookDelivery:
    """Queue a ``ping`` delivery to this webhook (follow it in the delivery log); 409 while an
    earlier ping to it is still pending."""
    return await service.queue_ping(session, owner_id, webhook_id)
