"""Writing an attempt's terminal state to the job's row, fenced by the attempt number
(``ace3_control.job_transitions.finish``), through a database outage when asked. A succeeded
attempt's exported model is registered in the same transaction
(:mod:`ace3_worker.export_registration`): the job reads ``succeeded`` with its
``fine_tuned_model_id``, or ``failed`` saying why its export cannot be a model; a store that
fails meanwhile is ridden out like a database outage."""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from ace3_control import job_transitions
from ace3_control.db import rows_changed
from ace3_control.models import JobState
from ace3_control.settings import Settings
from ace3_worker.attempt import MAX_DB_RETRY_SECONDS, POLL_SECONDS
from ace3_worker.export_registration import (
    ExportError,
    ExportRegistrar,
    PreparedExport,
    StoreOutage,
)

logger = logging.getLogger(__name__)

EXPORT_FAILED = (
    "training finished, but its exported model (artifacts/huggingface/) cannot be registered "
    "as a model: {reason}"
)


class OutcomeWriter:
    """Writes terminal states for one worker process; ``exports``: registers succeeded runs'
    exports (None: a writer that registers nothing, for tests of other paths)."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        exports: ExportRegistrar | None = None,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.exports = exports

    def record_surviving_outage(
        self, job_id: str, attempt: int, state: JobState, **fields: Any
    ) -> None:
        """:meth:`record`, retried through a database outage for up to a lease (after that the
        reconciler re-queues the job anyway)."""
        deadline = time.monotonic() + self.settings.lease_seconds
        delay = POLL_SECONDS
        while True:
            try:
                self.record(job_id, attempt, state, **fields)
                return
            except (DBAPIError, StoreOutage):
                if time.monotonic() > deadline:
                    logger.exception("job %s attempt %d: outcome not recorded", job_id, attempt)
                    return
                time.sleep(delay)
                delay = min(delay * 2, MAX_DB_RETRY_SECONDS)

    def record(self, job_id: str, attempt: int, state: JobState, **fields: Any) -> None:
        """Write the terminal ``state``; a succeeded run's export is checked and stored first
        (outside the transaction: it copies the whole model), then its row added in the
        transaction of the state. Raises StoreOutage (retried by the callers like a database
        outage) when the store failed meanwhile."""
        prepared: PreparedExport | None = None
        if state is JobState.SUCCEEDED and self.exports is not None:
            try:
                prepared = self.exports.prepare(self.sessions, job_id)
            except ExportError as exc:
                state = JobState.FAILED
                fields["error"] = EXPORT_FAILED.format(reason=exc)
                logger.warning("job %s attempt %d: %s", job_id, attempt, fields["error"])
        with self.sessions() as session:
            if prepared is not None and self.exports is not None:
                fields["fine_tuned_model_id"] = self.exports.add(session, prepared)
            result = session.execute(job_transitions.finish(job_id, attempt, state, **fields))
            if rows_changed(result):
                session.commit()
            else:
                session.rollback()
        if rows_changed(result):
            logger.info("job %s attempt %d: %s", job_id, attempt, state.value)
        else:
            logger.warning(
                "job %s attempt %d: not recorded as %s (no longer ours)",
                job_id,
                attempt,
                state.value,
            )
