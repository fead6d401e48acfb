"""The stream hub: reads of one job at one cursor are shared, a wake after a read started
makes the next read a new one, and a waiting stream wakes on its job's notification only."""

from __future__ import annotations

import asyncio

from ace3_server.services.stream_wake import StreamHub


async def test_followers_at_one_cursor_share_a_read_and_a_later_wake_starts_a_new_one() -> None:
    hub = StreamHub()
    reads = 0
    release = asyncio.Event()

    async def read() -> int:
        nonlocal reads
        reads += 1
        number = reads
        await release.wait()
        return number

    with hub.follow("job") as first, hub.follow("job") as second:
        assert first is second and hub.followed_jobs == 1
        a = asyncio.ensure_future(first.shared((0, 0, 0), read))
        b = asyncio.ensure_future(second.shared((0, 0, 0), read))
        await asyncio.sleep(0)
        hub.wake("job")  # (a row committed after that read began: it may not see it)
        c = asyncio.ensure_future(second.shared((0, 0, 0), read))
        await asyncio.sleep(0)
        release.set()
        assert await a == (0, 1) and await b == (0, 1)
        assert await c == (1, 2)  # a new read, started at the new wake count
        other = asyncio.ensure_future(first.shared((5, 0, 0), read))  # another cursor
        assert await other == (1, 3)
    assert hub.followed_jobs == 0


async def test_a_wait_ends_on_its_jobs_wake_or_its_timeout() -> None:
    hub = StreamHub()
    with hub.follow("job") as wakes, hub.follow("other"):
        waiting = asyncio.ensure_future(wakes.wait_past(0, timeout=30))
        await asyncio.sleep(0)
        hub.wake("other")
        hub.wake("unfollowed")
        await asyncio.sleep(0.01)
        assert not waiting.done()
        hub.wake("job")
        assert await asyncio.wait_for(waiting, 1) is True
        assert await wakes.wait_past(0, timeout=30) is True  # (already past: no wait)
        assert await wakes.wait_past(1, timeout=0.01) is False
        hub.wake_all()
        assert wakes.count == 2
