"""The embedded default (SQLite): migration 0012's triggers write a state change to the outbox
only while the owner has a webhook, and the delivery loop's fan-out turns it into one delivery
per subscribed webhook, with the body receivers get."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select, update

from ace3_control.db import (
    async_session_factory,
    make_async_engine,
    make_sync_engine,
    sync_session_factory,
)
from ace3_control.models import Job, Webhook, WebhookDelivery, WebhookEvent, new_id, utcnow
from ace3_control.settings import Settings
from ace3_server.migrations_check import upgrade
from ace3_server.webhooks.delivery import claim_due
from ace3_server.webhooks.outbox import fan_out, prune
from tests.conftest import insert_job


def test_state_changes_reach_subscribed_webhooks_through_the_outbox(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ace3.db'}"
    upgrade(url)
    engine = make_sync_engine(url)
    with sync_session_factory(engine)() as session:
        unwatched = insert_job(session, name="unwatched")  # its owner has no webhook yet
        owner_id = unwatched.owner_id
        for events in (["job.failed"], ["job.*"], ["search.*"]):
            session.add(Webhook(id=new_id(), owner_id=owner_id, url="http://h/", events=events,
                                secret="s", created_at=utcnow()))  # fmt: skip
        session.commit()
        session.execute(update(Job).where(Job.id == unwatched.id).values(state="running"))
        session.execute(update(Job).where(Job.id == unwatched.id).values(error="no change"))
        session.execute(update(Job).where(Job.id == unwatched.id).values(state="failed"))
        session.commit()
        outbox = session.scalars(select(WebhookEvent).order_by(WebhookEvent.id)).all()
        assert [(e.kind, e.state, e.previous_state) for e in outbox] == [
            ("job", "running", "queued"),
            ("job", "failed", "running"),
        ]
    engine.dispose()

    async def run() -> list[WebhookDelivery]:
        async_engine = make_async_engine(url)
        factory = async_session_factory(async_engine)
        async with factory() as session:
            assert await fan_out(session) == 2
            await session.commit()
        async with factory() as session:
            assert (await session.scalars(select(WebhookEvent))).all() == []
            rows = await session.scalars(
                select(WebhookDelivery).order_by(WebhookDelivery.created_at)
            )
            deliveries = list(rows.all())
        await async_engine.dispose()
        return deliveries

    deliveries = asyncio.run(run())
    # job.* gets both changes, job.failed the second, search.* neither.
    assert sorted(d.event_type for d in deliveries) == ["job.failed", "job.failed", "job.running"]
    body = next(d.payload for d in deliveries if d.event_type == "job.running")
    assert body["type"] == "job.running" and body["id"] in {d.id for d in deliveries}
    assert body["data"] == {"job": {"id": unwatched.id, "name": "unwatched", "state": "running",
                                    "previous_state": "queued", "attempt": 0}}  # fmt: skip
    assert all(d.state == "pending" and d.attempts == 0 for d in deliveries)


def test_finished_deliveries_past_the_retention_are_pruned(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ace3.db'}"
    upgrade(url)
    engine = make_sync_engine(url)
    now = utcnow()
    with sync_session_factory(engine)() as session:
        owner_id = insert_job(session).owner_id
        hook = Webhook(id=new_id(), owner_id=owner_id, url="http://h/", events=["*"], secret="s",
                       created_at=now)  # fmt: skip
        session.add(hook)
        for state, age_days in (
            ("delivered", 31),
            ("failed", 31),
            ("pending", 31),
            ("delivered", 1),
        ):
            session.add(WebhookDelivery(id=new_id(), webhook_id=hook.id, owner_id=owner_id,
                                        event_type="ping", payload={}, state=state, history=[],
                                        updated_at=now - timedelta(days=age_days)))  # fmt: skip
        session.commit()
    engine.dispose()

    async def run() -> list[tuple[str, int]]:
        async_engine = make_async_engine(url)
        async with async_session_factory(async_engine)() as session:
            assert await prune(session, Settings(webhook_retention_days=30)) == 2
            await session.commit()
            rows = (await session.scalars(select(WebhookDelivery))).all()
        await async_engine.dispose()
        return sorted((row.state, (now - row.updated_at).days) for row in rows)

    assert asyncio.run(run()) == [("delivered", 1), ("pending", 31)]


def test_deliveries_are_claimed_in_the_events_order_whatever_the_fan_out_order(
    tmp_path: Path,
) -> None:
    """Two API processes fan out a webhook's events in either order: the later event's
    delivery, written first, must still be claimed after the earlier one's."""
    url = f"sqlite:///{tmp_path / 'ace3.db'}"
    upgrade(url)
    engine = make_sync_engine(url)
    with sync_session_factory(engine)() as session:
        owner_id = insert_job(session).owner_id
        session.add(Webhook(id="w", owner_id=owner_id, url="http://h/", events=["*"],
                            secret="s", created_at=utcnow()))  # fmt: skip
        session.commit()
    engine.dispose()
    earlier = utcnow() - timedelta(seconds=5)

    def event(state: str, at: datetime) -> WebhookEvent:
        return WebhookEvent(owner_id=owner_id, kind="job", subject_id="j", state=state,
                            previous_state=None, created_at=at)  # fmt: skip

    async def run() -> list[str]:
        async_engine = make_async_engine(url)
        factory = async_session_factory(async_engine)
        for state, at in (("failed", earlier + timedelta(seconds=1)), ("running", earlier)):
            async with factory() as session:
                session.add(event(state, at))
                await session.commit()
            async with factory() as session:
                assert await fan_out(session) == 1
                await session.commit()
        async with factory() as session:
            claimed = await claim_due(session, Settings())
            await session.commit()
        await async_engine.dispose()
        return [json.loads(item.body)["type"] for item in claimed]

    assert asyncio.run(run()) == ["job.running", "job.failed"]
