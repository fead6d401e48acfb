"""This worker's row in the worker registry: inserted at start, heartbeated, deleted at shutdown.

The API admits a job only when some live worker can run it (``ace3_control.capacity``), so a
worker says what it has: device kind and count, slots and queue, and the distributions its Python
holds (``packages``: the API refuses a job whose requirements would replace one of them). The row lives in the same
database as the jobs. A thread renews ``last_seen_at`` every ``ACE3_HEARTBEAT_SECONDS``; a
database outage only delays a heartbeat (the row counts as gone after the staleness window and
comes back with the next heartbeat that gets through). A killed worker leaves its row behind to
go stale.

The engine uses no connection pool: this runs in the Celery main process, which forks the pool's
children, and a child must never inherit an open connection of it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from ace3_control import worker_registry
from ace3_control.capacity import Capacity, describe
from ace3_control.db import make_sync_engine, rows_changed
from ace3_control.installed_packages import installed_packages
from ace3_control.models import Worker, new_id, utcnow
from ace3_control.settings import Settings

logger = logging.getLogger(__name__)


class Registration:
    """One worker process's registry row; :meth:`start` registers and starts heartbeating,
    :meth:`stop` stops and deregisters."""

    def __init__(self, settings: Settings, capacity: Capacity, slots: int | None = None) -> None:
        self.settings = settings
        self.capacity = capacity
        self.slots = slots or settings.worker_slots
        self.worker_id = new_id()
        self.started_at = utcnow()
        self._pid = os.getpid()
        self._engine = make_sync_engine(settings.resolved_database_url, pooled=False)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _row(self) -> Worker:
        return Worker(
            id=self.worker_id,
            hostname=socket.gethostname()[:255],
            pid=self._pid,
            device_kind=self.capacity.device_kind,
            device_count=self.capacity.device_count,
            slots=self.slots,
            queue=self.settings.queue_name,
            heartbeat_seconds=self.settings.heartbeat_seconds,
            started_at=self.started_at,
            last_seen_at=utcnow(),
            # What a job's environment may add to but never replace (read once per process).
            packages=installed_packages(),
        )

    def register(self, *, announce: bool = True) -> None:
        """Insert this worker's row (again, if it was forgotten); ``announce`` logs it (Celery
        sets up logging only after the worker's first signal)."""
        with Session(self._engine) as session:
            session.merge(self._row())
            session.commit()
        if announce:
            self.announce()

    def announce(self) -> None:
        """Log what this worker registered as."""
        logger.info(
            "worker %s registered: %s, %d slot(s), queue %s",
            self.worker_id,
            describe(self.capacity),
            self.slots,
            self.settings.queue_name,
        )
        if self.capacity.device_count < 1:
            logger.error(
                "this worker advertises %s: no job can run on it (ACE3_WORKER_DEVICE=%s)",
                describe(self.capacity),
                self.settings.worker_device,
            )

    def heartbeat(self) -> None:
        """Renew ``last_seen_at``; a row the reconciler forgot is registered again."""
        with Session(self._engine) as session:
            result = session.execute(worker_registry.touch(self.worker_id))
            session.commit()
        if not rows_changed(result):
            self.register()

    def deregister(self) -> None:
        with Session(self._engine) as session:
            session.execute(worker_registry.forget(self.worker_id))
            session.commit()
        logger.info("worker %s deregistered", self.worker_id)

    def start_heartbeats(self) -> None:
        """Heartbeat from a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._beat, name="ace3-worker-heartbeat", daemon=True
        )
        self._thread.start()

    def _beat(self) -> None:
        while not self._stopping.wait(self.settings.heartbeat_seconds):
            try:
                self.heartbeat()
            except SQLAlchemyError as exc:
                logger.warning("worker heartbeat failed (%s); retrying", type(exc).__name__)
            except Exception:
                # Never let the thread die: a silent worker would count as gone.
                logger.exception("worker heartbeat failed; retrying")

    def stop(self) -> None:
        """Stop heartbeating and delete the row (a clean shutdown). Once, and only in the
        process that registered (a forked child inherits this object, not the row)."""
        if self._stopping.is_set() or os.getpid() != self._pid:
            return
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.heartbeat_seconds + 5)
        try:
            self.deregister()
        except SQLAlchemyError as exc:
            logger.warning(
                "could not deregister worker %s (%s); its row goes stale instead",
                self.worker_id,
                type(exc).__name__,
            )
        finally:
            self._engine.dispose()
