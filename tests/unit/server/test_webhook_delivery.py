"""Claiming and recording webhook deliveries (SQLite): a claim counts the attempt and hides the
delivery while it is POSTed; a failure schedules the retry, the last allowed failure ends it
failed, and the outcome of a claim another process took over is dropped."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
from sqlalchemy import select

from ace3_control.db import (
    async_session_factory,
    make_async_engine,
    make_sync_engine,
    sync_session_factory,
)
from ace3_control.models import Webhook, WebhookDelivery, new_id, utcnow
from ace3_control.settings import Settings
from ace3_server.migrations_check import upgrade
from ace3_server.webhooks.delivery import (
    MAX_IN_FLIGHT_PER_OWNER,
    Claimed,
    DeliveryLoop,
    Outcome,
    claim_due,
    record,
)
from tests.conftest import insert_job

SETTINGS = Settings(webhook_max_attempts=2, webhook_retry_base_seconds=60)


def test_attempts_are_claimed_retried_and_end_failed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ace3.db'}"
    upgrade(url)
    engine = make_sync_engine(url)
    with sync_session_factory(engine)() as session:
        owner_id = insert_job(session).owner_id
        hook = Webhook(id=new_id(), owner_id=owner_id, url="http://h/", events=["*"],
                       secret="whsec_s", created_at=utcnow())  # fmt: skip
        session.add(hook)
        session.add(WebhookDelivery(id="d1", webhook_id=hook.id, owner_id=owner_id,
                                    event_type="ping", payload={"id": "d1"}, history=[]))  # fmt: skip
        session.commit()
    engine.dispose()

    async def run() -> None:
        async_engine = make_async_engine(url)
        factory = async_session_factory(async_engine)

        async def claim() -> list[Claimed]:
            async with factory() as session:
                claimed = await claim_due(session, SETTINGS)
                await session.commit()
                return claimed

        async def settle(claimed: Claimed, outcome: Outcome) -> WebhookDelivery:
            async with factory() as session:
                await record(session, claimed, outcome, SETTINGS)
                await session.commit()
                row = await session.get(WebhookDelivery, "d1")
                assert row is not None
                return row

        first = await claim()
        assert [(c.delivery_id, c.attempt, c.body) for c in first] == [("d1", 1, b'{"id":"d1"}')]
        assert await claim() == []  # held while it is POSTed
        row = await settle(first[0], Outcome(500, "HTTP 500", 12.5))
        assert row.state == "pending" and row.attempts == 1 and row.last_status_code == 500
        assert 40 <= (row.next_attempt_at - utcnow()).total_seconds() <= 80
        assert await claim() == []  # not due yet
        async with factory() as session:
            due = await session.get(WebhookDelivery, "d1")
            assert due is not None
            due.next_attempt_at = utcnow()
            await session.commit()
        second = await claim()
        assert second[0].attempt == 2
        stale = await settle(first[0], Outcome(200, None, 1.0))  # the first claim, late
        assert stale.state == "pending" and len(stale.history) == 1
        row = await settle(second[0], Outcome(None, "ConnectError: refused", 3.0))
        assert row.state == "failed" and row.attempts == 2 and row.delivered_at is None
        assert [entry["error"] for entry in row.history] == ["HTTP 500", "ConnectError: refused"]
        await async_engine.dispose()

    asyncio.run(run())


def test_a_slow_receiver_holds_up_only_its_own_deliveries(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ace3.db'}"
    upgrade(url)
    engine = make_sync_engine(url)
    with sync_session_factory(engine)() as session:
        owner_id = insert_job(session).owner_id
        for host in ("slow", "fast"):
            hook = Webhook(id=host, owner_id=owner_id, url=f"http://{host}.test/", events=["*"],
                           secret="whsec_s", created_at=utcnow())  # fmt: skip
            session.add(hook)
            session.flush()
            session.add(WebhookDelivery(id=f"{host}-1", webhook_id=host, owner_id=owner_id,
                                        event_type="ping", payload={}, history=[]))  # fmt: skip
        session.commit()
    engine.dispose()
    settings = Settings(webhook_allow_private_networks=True)

    async def run() -> None:
        release = asyncio.Event()
        seen: list[str] = []

        async def handler(request: httpx.Request) -> httpx.Response:
            seen.append(request.url.host)
            if request.url.host == "slow.test":
                await release.wait()
            return httpx.Response(204, stream=httpx.ByteStream(b""))

        async_engine = make_async_engine(url)
        factory = async_session_factory(async_engine)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            loop = DeliveryLoop(factory, client, settings)
            assert await loop.pass_once() == 2
            for _ in range(100):
                if "fast" not in loop.in_flight and "slow.test" in seen:
                    break
                await asyncio.sleep(0.02)
            assert set(loop.in_flight) == {"slow"}  # fast was delivered meanwhile
            async with factory() as session:
                session.add(WebhookDelivery(id="slow-2", webhook_id="slow", owner_id=owner_id,
                                            event_type="ping", payload={}, history=[]))  # fmt: skip
                await session.commit()
            assert await loop.pass_once() == 0  # slow-2 waits for slow-1's task
            release.set()
            await loop.drain()
            assert await loop.pass_once() == 1
            await loop.drain()
        async with factory() as session:
            states = {row.id: row.state for row in await session.scalars(select(WebhookDelivery))}
        assert states == {"fast-1": "delivered", "slow-1": "delivered", "slow-2": "delivered"}
        assert sorted(seen) == ["fast.test", "slow.test", "slow.test"]
        await async_engine.dispose()

    asyncio.run(run())


def test_one_owner_gets_at_most_its_share_of_webhooks_in_flight(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ace3.db'}"
    upgrade(url)
    engine = make_sync_engine(url)
    with sync_session_factory(engine)() as session:
        owners = [insert_job(session).owner_id for _ in range(2)]
        for owner_id, count in zip(owners, (MAX_IN_FLIGHT_PER_OWNER + 3, 1), strict=True):
            for n in range(count):
                hook_id = f"{owner_id[:8]}-{n}"
                session.add(Webhook(id=hook_id, owner_id=owner_id, url=f"http://{hook_id}.test/",
                                    events=["*"], secret="whsec_s", created_at=utcnow()))  # fmt: skip
                session.flush()
                session.add(WebhookDelivery(id=f"d-{hook_id}", webhook_id=hook_id,
                                            owner_id=owner_id, event_type="ping", payload={},
                                            history=[]))  # fmt: skip
        session.commit()
    engine.dispose()
    settings = Settings(webhook_allow_private_networks=True)

    async def run() -> None:
        release = asyncio.Event()

        async def handler(request: httpx.Request) -> httpx.Response:
            await release.wait()
            return httpx.Response(204, stream=httpx.ByteStream(b""))

        async_engine = make_async_engine(url)
        factory = async_session_factory(async_engine)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            loop = DeliveryLoop(factory, client, settings)
            assert await loop.pass_once() == MAX_IN_FLIGHT_PER_OWNER + 1
            assert await loop.pass_once() == 0  # the cap holds on the next pass too
            in_flight = Counter(loop.owner_of.values())
            assert in_flight == {owners[0]: MAX_IN_FLIGHT_PER_OWNER, owners[1]: 1}
            async with factory() as session:
                untouched = (
                    await session.scalars(
                        select(WebhookDelivery).where(WebhookDelivery.attempts == 0)
                    )
                ).all()
            assert len(untouched) == 3  # left due, not claimed
            release.set()
            await loop.drain()
            assert await loop.pass_once() == 3
            await loop.drain()
        await async_engine.dispose()

    asyncio.run(run())
