"""The feeder of one running attempt: every shard its readers ask for is made present in the
job's directory, and every shard no request names any more is taken out of it.

A thread polls the request files (:mod:`ace3_worker.shard_requests`, every ``POLL_SECONDS``, and
at once when a fetch is done) and orders what they name: each request's first shard (the one
its reader opens now) before any look-ahead, round-robin across the requests. The attempt keeps
at most its share of the cache linked (:class:`~ace3_worker.shard_streams.Readers`): room for
every reader's current shard is kept (the largest shards, at worst), a look-ahead shard is
fetched only within the rest. Up to
``MAX_FETCHES`` tasks run at once, each making one shard present: from the node cache
(:mod:`ace3_worker.shard_cache`), fetched into it first when it is missing
(:mod:`ace3_worker.shard_fetch`: from the bucket of a registered dataset, from the artifact
store for an uploaded one; waiting for room when the cache is full of shards running jobs
link, for a reader's current shard only, and for ``ACE3_DATASET_CACHE_WAIT_SECONDS`` at most),
then hard-linked into ``data/<split>/shards/``. The sha256 of every shard the job gets is said
in its log (the worker's own stream); whether it was fetched or found in the cache (which tells
whether another job of the node reads it) only in the worker's own log.

A shard that changed since registration, or is gone, or is larger than the cache, stops the
attempt through ``fail`` (which fails the job with that reason, no retry) and the feeder with
it. Stopping the feeder (the attempt ended) abandons fetches under way, waits for their threads
(none links a shard into the directory after it) and removes nothing from the cache.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ace3_control.settings import Settings
from ace3_control.source_client import source_client
from ace3_control.storage import ArtifactStore, open_store
from ace3_worker.shard_cache import CacheFullError, CacheTooSmallError, ShardCache
from ace3_worker.shard_fetch import (
    FetchStopped,
    Obtained,
    S3ShardSource,
    ShardChangedError,
    ShardSource,
    StoreShardSource,
    obtain,
)
from ace3_worker.shard_place import place
from ace3_worker.shard_requests import Request, RequestReader
from ace3_worker.shard_streams import Readers, ShardStream

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.05
MAX_FETCHES = 4
# A look-ahead shard that found no room is asked for again after this long.
NO_ROOM_RETRY_SECONDS = 0.5
# A fetch that failed otherwise (the network, the source) is retried this often, then fails
# the job; the waits between tries double from the first.
FETCH_TRIES = 5
FIRST_RETRY_SECONDS = 1.0
# A poll pass that fails is logged with its traceback at most this often.
ERROR_LOG_SECONDS = 60.0

Key = tuple[str, str]  # (split, file)


def priority(requests: list[Request]) -> list[tuple[Key, bool]]:
    """Every shard the requests name, once, in the order they are made present: position by
    position across the requests (each reader's current shard first); with whether it is some
    reader's current shard."""
    order: dict[Key, bool] = {}
    for position in range(max((len(r.need) for r in requests), default=0)):
        for request in requests:
            if position < len(request.need):
                order.setdefault((request.split, request.need[position]), position == 0)
    return list(order.items())


class ShardFeed:
    """The feeder of one attempt's streamed splits."""

    def __init__(
        self,
        streams: tuple[ShardStream, ...],
        output_dir: Path,
        cache: ShardCache,
        sources: Callable[[ShardStream], ShardSource],
        *,
        log: Callable[[str], None],
        fail: Callable[[str], None],
        job_id: str = "",
        readers: Readers | None = None,
        wait_seconds: float | None = None,
    ) -> None:
        self.streams: dict[str, ShardStream] = {s.split: s for s in streams}
        if "validation" not in self.streams and "train" in self.streams:
            # (validation held out of the train shards: its readers ask for train files)
            self.streams["validation"] = self.streams["train"]
        self.cache = cache
        self.sources = sources
        self.log = log
        self.fail_attempt = fail
        self.job_id = job_id
        self.requests = RequestReader(
            output_dir,
            {split: set(s.files) for split, s in self.streams.items()},
            log,
            None if readers is None else readers.names,
        )
        # What the attempt may keep linked, and the part of it kept for current shards.
        self.share = cache.bound if readers is None else readers.share
        self.kept_for_current = 0 if readers is None else readers.current_bytes
        self.wait_seconds = wait_seconds
        self._logged_error = -ERROR_LOG_SECONDS
        self._in_pool = threading.local()
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.failure: str | None = None
        self._lock = threading.Lock()
        self._present: set[Key] = set()  # linked into the job's directory by this feeder
        self._in_flight: dict[Key, Future[None]] = {}
        self._not_before: dict[Key, float] = {}
        self._tries: dict[Key, int] = {}
        self._told: set[tuple[str, str]] = set()  # (digest, file) whose sha256 the log has
        self._pool = ThreadPoolExecutor(MAX_FETCHES, thread_name_prefix=f"shards-{job_id}")
        self._thread = threading.Thread(target=self._run, name=f"feed-{job_id}", daemon=True)

    @classmethod
    def for_attempt(
        cls,
        settings: Settings,
        streams: tuple[ShardStream, ...],
        output_dir: Path,
        *,
        log: Callable[[str], None],
        fail: Callable[[str], None],
        job_id: str = "",
        store: ArtifactStore | None = None,
        readers: Readers | None = None,
    ) -> ShardFeed:
        """The feeder with this worker's cache; a registered dataset's shards are read with the
        service's S3 client, an uploaded one's from ``store`` (default: the settings' store,
        opened when first needed)."""
        stores: list[ArtifactStore] = [] if store is None else [store]
        made = threading.Lock()

        def sources(stream: ShardStream) -> ShardSource:
            uri = stream.manifest.uri
            if stream.kind == "shards":
                with made:
                    if not stores:
                        stores.append(open_store(settings))
                return StoreShardSource(uri, stores[0])
            if not uri.startswith("s3://"):
                raise ValueError(f"shards at {uri!r} cannot be streamed (not an s3:// source)")
            # (the process's one client for these settings: boto3's clients are thread-safe)
            return S3ShardSource(uri, source_client(settings))

        cache = ShardCache(settings.resolved_dataset_cache_dir, settings.dataset_cache_bytes)
        return cls(
            streams,
            output_dir,
            cache,
            sources,
            log=log,
            fail=fail,
            job_id=job_id,
            readers=readers,
            wait_seconds=settings.dataset_cache_wait_seconds,
        )

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> ShardFeed:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """The attempt is over: stop polling and abandon the fetches under way, waiting for
        their threads (nothing is removed from the cache; the job's directory goes with the
        attempt, after this returns: no fetch links a shard into it then)."""
        self.stop_event.set()
        self.wake.set()
        in_pool = getattr(self._in_pool, "yes", False)
        self._pool.shutdown(wait=not in_pool, cancel_futures=True)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self.failure is not None or self.stop_event.is_set():
                return
            self.failure = reason
        logger.error("job %s: %s", self.job_id, reason)
        self.stop_event.set()
        self.wake.set()
        self.fail_attempt(reason)

    # -- the poll loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.poll()
            except Exception:  # (never the worker's end: the next pass tries again)
                if time.monotonic() - self._logged_error >= ERROR_LOG_SECONDS:
                    self._logged_error = time.monotonic()
                    logger.exception("job %s: the shard feeder's pass failed", self.job_id)
            self.wake.wait(POLL_SECONDS)
            self.wake.clear()

    def poll(self) -> None:
        """One pass: read the requests, take out what none names, start what is missing."""
        # (a split streamed from another's shards asks for them under that split's name)
        requests = [
            dataclasses.replace(r, split=self.streams[r.split].split) for r in self.requests.read()
        ]
        wanted = priority(requests)
        names = {key for key, _ in wanted}
        with self._lock:
            done = [key for key, future in self._in_flight.items() if future.done()]
            for key in done:
                del self._in_flight[key]
            for key in sorted(self._present - names - set(self._in_flight)):
                self._take_out(key)
            now = time.monotonic()
            currents = {key for key, current in wanted if current}
            ahead = sum(map(self._bytes, (self._present | set(self._in_flight)) - currents))
            for key, current in wanted:
                if len(self._in_flight) >= MAX_FETCHES or self.stop_event.is_set():
                    break
                if key in self._present or key in self._in_flight:
                    continue
                if self._not_before.get(key, 0.0) > now:
                    continue
                if not current:  # (current shards: kept_for_current holds the most they take)
                    if ahead + self._bytes(key) > self.share - self.kept_for_current:
                        continue  # (past the attempt's share: once its readers move on)
                    ahead += self._bytes(key)
                try:
                    future = self._pool.submit(self._make_present, key, current)
                except RuntimeError:
                    return  # (stopped meanwhile)
                self._in_flight[key] = future

    def _bytes(self, key: Key) -> int:
        """What a shard counts against the attempt's share (a copy too, not only a link)."""
        return self.cache.accounted(self.streams[key[0]].shard(key[1]).size)

    def _take_out(self, key: Key) -> None:
        stream = self.streams[key[0]]
        with contextlib.suppress(FileNotFoundError):
            (stream.directory / key[1]).unlink()
        self._present.discard(key)
        self.cache.touch(stream.digest, key[1])

    # -- one shard -------------------------------------------------------------------------------
    def _make_present(self, key: Key, current: bool) -> None:
        self._in_pool.yes = True
        try:
            placed = self._place(key, current)
        except FetchStopped:
            return
        except (ShardChangedError, CacheTooSmallError, CacheFullError) as exc:
            self._fail(self._reason(key, exc))
            return
        except Exception as exc:
            self._retry_later(key, exc)
            return
        finally:
            self.wake.set()
        if not placed:
            with self._lock:
                self._not_before[key] = time.monotonic() + NO_ROOM_RETRY_SECONDS

    def _reason(self, key: Key, exc: Exception) -> str:
        if isinstance(exc, CacheTooSmallError):
            name = self.streams[key[0]].shard(key[1]).name
            return f"dataset shard {name!r} is {exc}: raise it, or split the shard"
        if isinstance(exc, CacheFullError):
            name = self.streams[key[0]].shard(key[1]).name
            return f"dataset shard {name!r} {exc}: raise it, or run fewer jobs on this node"
        return str(exc)

    def _place(self, key: Key, current: bool) -> bool:
        """Make the shard present in the job's directory; False when the cache has no room for
        it yet (a look-ahead shard only)."""
        split, file = key
        stream = self.streams[split]
        shard = stream.shard(file)
        source = self.sources(stream)

        def waiting(seconds: float, linked: int) -> None:
            self.log(
                f"ace3: shard {shard.name!r} has waited {seconds:.0f} s for room in the dataset "
                f"cache: {linked} of its {self.cache.bound} bytes (ACE3_DATASET_CACHE_BYTES) "
                "hold shards running jobs read"
            )

        obtained = obtain(
            self.cache,
            source,
            stream.digest,
            file,
            shard,
            stop=self.stop_event,
            wait=current,
            waiting=waiting,
            wait_seconds=self.wait_seconds,
        )
        if obtained is None:
            return False
        self._tell(stream.digest, shard.name, shard.size, obtained)
        with self.cache.locked(stream.digest, file, shared=True, stop=self.stop_event) as held:
            if not held:
                raise FetchStopped(file)
            if self.cache.lookup(stream.digest, file) is None:
                raise OSError(f"shard {shard.name!r} left the cache before it was linked")
            if self.stop_event.is_set():
                raise FetchStopped(file)
            place(obtained.cached.path, stream.directory / file)
            with self._lock:  # (in flight until now: the poll loop left it alone)
                self._present.add(key)
                self._tries.pop(key, None)
            self.cache.touch(stream.digest, file)
        return True

    def _tell(self, digest: str, name: str, size: int, obtained: Obtained) -> None:
        """The job's log says the sha256 of the bytes it gets, once per shard, before they are
        in its directory."""
        with self._lock:
            first = (digest, name) not in self._told
            self._told.add((digest, name))
        if first:  # (how: the worker's own log; the job's would learn what other jobs read)
            how = "fetched from the source" if obtained.fetched else "from this node's cache"
            logger.info("job %s: dataset shard %r %s", self.job_id, name, how)
            self.log(
                f"ace3: dataset shard {name!r} ({size} bytes): sha256 {obtained.cached.sha256}"
            )

    def _retry_later(self, key: Key, exc: Exception) -> None:
        name = self.streams[key[0]].shard(key[1]).name
        with self._lock:
            tries = self._tries.get(key, 0) + 1
            self._tries[key] = tries
            self._not_before[key] = time.monotonic() + FIRST_RETRY_SECONDS * 2 ** (tries - 1)
        if tries >= FETCH_TRIES:
            self._fail(f"could not fetch dataset shard {name!r} ({tries} tries): {exc}")
            return
        logger.warning("job %s: fetching shard %r failed (%s); retrying", self.job_id, name, exc)
        self.log(f"ace3: fetching dataset shard {name!r} failed ({exc}); retrying")
