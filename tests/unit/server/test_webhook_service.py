"""The webhook routes' logic on Postgres, where concurrency is real: concurrent creates cannot
pass the per-owner cap, and test pings cannot pile up."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import HTTPException
from sqlalchemy import func, select

from ace3_control.db import (
    async_session_factory,
    make_async_engine,
    make_sync_engine,
    sync_session_factory,
)
from ace3_control.models import DeliveryState, Owner, Webhook, WebhookDelivery
from ace3_control.settings import Settings
from ace3_server.webhooks import service
from ace3_server.webhooks.schemas import WebhookCreate


def _owner(database_url: str) -> str:
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        owner = Owner(name="webhook-service-test")
        session.add(owner)
        session.commit()
        owner_id = owner.id
    engine.dispose()
    return owner_id


def test_concurrent_creates_stop_at_the_per_owner_cap(database_url: str) -> None:
    owner_id = _owner(database_url)
    settings = Settings(webhook_max_per_owner=2, webhook_allow_private_networks=True)
    body = WebhookCreate(url="http://receiver.test/hook", events=["job.*"])

    async def run() -> tuple[list[object], int]:
        engine = make_async_engine(database_url)
        factory = async_session_factory(engine)

        async def create() -> object:
            async with factory() as session:
                return await service.create_webhook(session, owner_id, body, settings)

        results = await asyncio.gather(*(create() for _ in range(6)), return_exceptions=True)
        async with factory() as session:
            count = await session.scalar(
                select(func.count()).select_from(Webhook).where(Webhook.owner_id == owner_id)
            )
        await engine.dispose()
        return list(results), count or 0

    results, count = asyncio.run(run())
    assert count == 2
    refused = [r for r in results if isinstance(r, Exception)]
    assert len(refused) == 4
    assert all(getattr(r, "status_code", None) == 422 for r in refused)


def test_a_second_ping_is_refused_while_the_first_is_pending(database_url: str) -> None:
    owner_id = _owner(database_url)
    stranger_id = _owner(database_url)
    settings = Settings(webhook_allow_private_networks=True)
    body = WebhookCreate(url="http://receiver.test/hook", events=["job.*"])

    async def run() -> None:
        engine = make_async_engine(database_url)
        factory = async_session_factory(engine)
        async with factory() as session:
            hook = await service.create_webhook(session, owner_id, body, settings)
        async with factory() as session:
            first = await service.queue_ping(session, owner_id, hook.id)
        for who, status in ((owner_id, 409), (stranger_id, 404)):
            async with factory() as session:
                with pytest.raises(HTTPException) as caught:
                    await service.queue_ping(session, who, hook.id)
            assert caught.value.status_code == status
            if status == 409:
                assert f"still pending (delivery {first.id})" in str(caught.value.detail)
        async with factory() as session:
            row = await session.get(WebhookDelivery, first.id)
            assert row is not None
            row.state = DeliveryState.FAILED
            await session.commit()
        async with factory() as session:
            again = await service.queue_ping(session, owner_id, hook.id)
        assert again.id != first.id and again.event_type == "ping"
        await engine.dispose()

    asyncio.run(run())
