"""A short-lived, bounded cache of verified API keys (per API process).

``GET /v1/jobs/{id}`` costs two database round trips: the key, then the job. A key verified
in the last ``ACE3_API_KEY_CACHE_SECONDS`` (5 s; 0 turns the cache off) is taken from here, so
a revoked key keeps working in a process that verified it for at most that long. Only valid
keys are kept (a key created a moment ago is never refused for having been unknown), under the
SHA-256 of the key, never the key itself; at most ``max_entries`` keys, the oldest first out.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class KeyCache:
    def __init__(
        self,
        ttl_seconds: float,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_entries = max_entries
        self._clock = clock
        self._owners: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def owner(self, key_hash: str) -> str | None:
        """The owner of a key verified less than ``ttl_seconds`` ago, else None."""
        entry = self._owners.get(key_hash)
        if entry is None:
            return None
        owner_id, expires = entry
        if self._clock() >= expires:
            del self._owners[key_hash]
            return None
        return owner_id

    def remember(self, key_hash: str, owner_id: str) -> None:
        if self.ttl_seconds <= 0:
            return
        self._owners.pop(key_hash, None)
        self._owners[key_hash] = (owner_id, self._clock() + self.ttl_seconds)
        while len(self._owners) > self.max_entries:
            self._owners.popitem(last=False)
