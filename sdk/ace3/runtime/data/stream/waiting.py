"""A reader's side of streaming: saying which shards it needs, and waiting for them.

The worker (outside the sandbox) fetches shards and links each into the dataset's directory
once it is whole; it learns what to fetch from each reader's request file
(:func:`ace3.config.shards.request_file_name` in ``StreamSpec.requests``), which names the
shard the reader opens now and the next ones it will read. The file is replaced atomically
(temp file + rename), so the worker never reads half of one. A shard no request names any more
may be taken out of the job's directory again.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

from ace3.config.shards import REQUEST_MAX_SHARDS, ShardRequest

#: The engine's log channel (ace3.runtime.observe.log.ENGINE, by name: data/ never imports it).
ENGINE = logging.getLogger("ace3.runtime")
LOG_EVERY_S = 30.0
FIRST_PAUSE_S = 0.001
LONGEST_PAUSE_S = 0.1


def _pause(seconds: float) -> None:
    time.sleep(seconds)


class RequestFile:
    """One reader's request file."""

    def __init__(self, directory: str | Path, name: str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / name
        self._last: list[str] | None = None

    def write(self, need: list[str]) -> None:
        """Say which shards are needed, in order (unchanged requests are not rewritten)."""
        need = list(dict.fromkeys(need))[:REQUEST_MAX_SHARDS]
        if need == self._last:
            return
        raw = ShardRequest(need=need).model_dump_json().encode()
        self.directory.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=self.directory, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                os.fchmod(out.fileno(), 0o644)
                out.write(raw)
            os.replace(temp, self.path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        self._last = need


def wait_for_file(path: Path, who: str) -> None:
    """Return once ``path`` exists: polled, the pause growing to 100 ms; every 30 s the engine's
    log says which shard is awaited."""
    if path.exists():
        return
    started = last_log = time.monotonic()
    pause = FIRST_PAUSE_S
    while not path.exists():
        _pause(pause)
        pause = min(pause * 2, LONGEST_PAUSE_S)
        now = time.monotonic()
        if now - last_log >= LOG_EVERY_S:
            last_log = now
            ENGINE.info(f"{who}: waiting {now - started:.0f} s for shard {path.name}")
