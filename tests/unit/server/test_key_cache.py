"""The key cache: an entry lives ttl seconds, a 0 ttl keeps nothing, the oldest goes first."""

from __future__ import annotations

from ace3_server.key_cache import KeyCache


def test_entries_expire_after_the_ttl_and_the_cache_is_bounded() -> None:
    now = [100.0]
    cache = KeyCache(5.0, max_entries=2, clock=lambda: now[0])
    cache.remember("hash-a", "owner-a")
    assert cache.owner("hash-a") == "owner-a" and cache.owner("hash-b") is None
    now[0] += 4.9
    assert cache.owner("hash-a") == "owner-a"
    now[0] += 0.1
    assert cache.owner("hash-a") is None
    for name in ("a", "b", "c"):
        cache.remember(f"hash-{name}", f"owner-{name}")
    assert [cache.owner(f"hash-{name}") for name in "abc"] == [None, "owner-b", "owner-c"]
    off = KeyCache(0.0)
    off.remember("hash-a", "owner-a")
    assert off.owner("hash-a") is None
