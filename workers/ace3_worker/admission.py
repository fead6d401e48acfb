"""Whether this worker can run a job, and handing back a job it cannot.

Before claiming, a worker checks the job fits it (``ace3_control.capacity``: enough GPUs or CPU
processes, a CUDA worker for nccl). One that does not is handed back to the queue, delayed, for
a worker that can run it: a job never runs with fewer processes than it asked for. The
:class:`Admission` object lives as long as the worker process (it remembers which jobs it
handed back, so copies of one job never multiply).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ace3_control import job_transitions
from ace3_control.capacity import JobNeeds, fit_problem
from ace3_control.db import rows_changed
from ace3_control.models import Job, JobState
from ace3_control.settings import Settings
from ace3_worker.device import local_capacity
from ace3_worker.messages import RecentCopies, publish

logger = logging.getLogger(__name__)


class JobShape(NamedTuple):
    """A job's state and what each of its nodes needs."""

    state: str
    needs: JobNeeds

    @property
    def multi_node(self) -> bool:
        return self.needs.nodes > 1

    @property
    def assembling(self) -> bool:
        """A multi-node job whose leader is waiting for the workers of its other nodes."""
        return self.state == JobState.STARTING and self.multi_node


class Admission:
    """The fit check and the hand-back of one worker process."""

    def __init__(self, settings: Settings, sessions: sessionmaker[Session]) -> None:
        self.settings = settings
        self.sessions = sessions
        self.handed_back = RecentCopies()

    def shape(self, job_id: str) -> JobShape | None:
        """The job's state and needs (None: there is no such job)."""
        with self.sessions() as session:
            row = session.execute(
                select(Job.state, Job.num_processes, Job.config).where(Job.id == job_id)
            ).first()
        if row is None:
            return None
        return JobShape(str(row.state), JobNeeds.from_job(int(row.num_processes), row.config))

    def unfit(self, shape: JobShape | None) -> str | None:
        """Why this worker cannot run the queued job, or a node of the multi-node job that
        assembles its gang (None: it can, or there is nothing to take, which the claim then
        finds out)."""
        if shape is None:
            return None
        if shape.state != JobState.QUEUED and not shape.assembling:
            return None
        return fit_problem(shape.needs, local_capacity(self.settings))

    def hand_back(self, job_id: str, reason: str) -> None:
        """Publish a job this worker cannot run again, delayed by ``unfit_republish_seconds``,
        for a worker that can. A copy of the same job that comes back to this process within
        half that interval is dropped (another copy is on its way), so copies never multiply and
        a worker never spins on a job; the reconciler re-publishes it if every copy is lost."""
        delay = self.settings.unfit_republish_seconds
        if self.handed_back.sent_within(job_id, delay):
            logger.debug("job %s: another copy was handed back just now; dropping this one", job_id)
            return
        with self.sessions() as session:
            result = session.execute(job_transitions.mark_handed_back(job_id))
            session.commit()
        if not rows_changed(result):
            return  # claimed or cancelled meanwhile
        self.handed_back.note(job_id)
        logger.info(
            "job %s does not fit this worker (%s): handing it back to the queue in %g s",
            job_id,
            reason,
            delay,
        )
        publish(
            self.settings,
            job_id,
            countdown=delay,
            on_failure="not handed back; the reconciler will publish it",
        )
