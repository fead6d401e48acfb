"""Runs one attempt of a job on this worker: take the next job, prepare, launch torchrun, watch
it, record the outcome. This module only composes the steps; each has its own module:

- :mod:`ace3_control.scheduling`: which job a message lets this worker take (the fair queue:
  priority, owners' turns, quotas; the oldest assembling gang first).

- :mod:`ace3_worker.admission`: whether the job fits this worker; handing back one that does not.
- :mod:`ace3_worker.membership`: this worker's part in the attempt, one interface for both
  shapes: :class:`~ace3_worker.membership.SingleNode` (a gang of one) or a node of a
  multi-node gang (:mod:`ace3_worker.gang` assembles it, :mod:`ace3_worker.gang_node` runs it).
- :mod:`ace3_worker.attempt_run`: one attempt of a part taken: prepared, launched, watched,
  drained and reported.
- :mod:`ace3_worker.workspace`: the uid, the attempt's directory, the artifacts restored.
- :mod:`ace3_worker.gpu_sets`: the devices the attempt holds (its ``CUDA_VISIBLE_DEVICES``).
- :mod:`ace3_worker.launch`: the sandboxed torchrun and the threads reading its output.
- :mod:`ace3_worker.watch`: the watch loop, heartbeats, max-runtime, database outages.
- :mod:`ace3_worker.ingest`: log lines, events, checkpoints and artifacts into the database.
- :mod:`ace3_worker.outcome`: the attempt's result, retries, out-of-memory halving, verdicts.

Every write of a job's state is a conditional update fenced by the attempt number
(``ace3_control.job_transitions``), so a duplicate message or a worker that lost its lease
changes nothing. Every attempt runs in the worker's sandbox (:mod:`ace3_worker.sandbox`): its
own uid and its own devices (both leased before the claim, released after everything of the
attempt is dead); its directory is removed on every path, and the sandbox is always killed before the attempt is
recorded, so no process outlives its job.
"""

from __future__ import annotations

import functools
import logging
import os
import socket

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ace3_control import scheduling
from ace3_control.capacity import Capacity
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobState
from ace3_control.settings import Settings, get_settings
from ace3_control.storage import open_store
from ace3_worker.admission import Admission
from ace3_worker.attempt_run import AttemptRunner
from ace3_worker.device import device_pool, local_capacity
from ace3_worker.export_registration import ExportRegistrar
from ace3_worker.gang import GangMember, NodeSeat
from ace3_worker.gang_node import GangNode
from ace3_worker.gpu_sets import DeviceAllocator, DeviceSet
from ace3_worker.ingest import Ingest
from ace3_worker.membership import Membership, SingleNode
from ace3_worker.messages import publish
from ace3_worker.outcome import Outcomes
from ace3_worker.sandbox.identity import NoFreeIdentityError
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.warm import WarmSlot
from ace3_worker.watch import Watcher
from ace3_worker.workspace import Workspace

logger = logging.getLogger(__name__)


@functools.cache
def _sessions(database_url: str) -> sessionmaker[Session]:
    # One engine per worker process (created after Celery's fork, on first use).
    return sync_session_factory(make_sync_engine(database_url))


def worker_identity() -> str:
    """This process, as the job row's ``worker_id`` names it."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Supervisor:
    """Runs jobs' attempts for one worker process. It may live as long as the process (the
    Celery task keeps one per process): what it remembers between jobs is which copies of a
    job's message it handed back or passed on."""

    def __init__(
        self,
        settings: Settings,
        node_id: str | None = None,
        *,
        keeps_warm_sandboxes: bool = False,
        slot: int = 0,
    ) -> None:
        """``node_id`` names this worker in multi-node gangs (one node per worker per attempt):
        the worker's registry id, shared by its slots (by default, this process's identity).
        ``keeps_warm_sandboxes``: a slot's supervisor, which lives as long as its process, keeps
        a sandbox prepared for its next job (:mod:`ace3_worker.warm`; unless
        ``ACE3_WARM_LAUNCH=false``); one made for a single job starts it cold. ``slot``: which of
        the worker's slots (Celery pool processes) this one is."""
        self.settings = settings
        self.sessions = _sessions(settings.resolved_database_url)
        self.store = open_store(settings)
        self.worker_id = worker_identity()
        self.limits = JobLimits.from_settings(settings)
        self.admission = Admission(settings, self.sessions)
        self.workspace = Workspace(settings, self.sessions, self.store, self.worker_id)
        self.ingest = Ingest(settings, self.sessions, self.store)
        self.watcher = Watcher(settings, self.ingest)
        self.outcomes = Outcomes(settings, self.sessions, self.limits, ExportRegistrar(self.store))
        self.gang = GangMember(
            settings, self.sessions, worker_id=node_id or self.worker_id, process=self.worker_id
        )
        pool = device_pool(settings)
        self.devices = (
            None if pool is None else DeviceAllocator(pool, settings.resolved_worker_gpu_lock_dir)
        )
        self.warm = WarmSlot(
            settings, self.workspace, self.limits, pool, keeps_warm_sandboxes, slot
        )
        self.runner = AttemptRunner(
            settings, self.workspace, self.warm, self.limits, self.watcher, self.ingest
        )

    def run(self, job_id: str) -> None:
        """A message says there is work (``job_id``'s): take the job the fair queue says is
        next for this worker (:mod:`ace3_control.scheduling`), which need not be the message's:
        the message of the job taken serves the one passed over. The slot's warm sandbox
        (:mod:`ace3_worker.warm`), if one is prepared, runs it with its uid; when the message
        finds nothing to run, it waits for the next one."""
        warm = self.warm.take()
        try:
            identity = warm.identity if warm is not None else self.workspace.lease_identity()
        except NoFreeIdentityError as exc:
            self._decline(job_id, str(exc))
            return
        devices = None
        membership = None
        try:
            membership, devices = self._take_next(job_id, self.warm.preferred_devices(warm))
            if membership is not None:
                try:
                    self.runner.run(membership, identity, devices, warm)
                finally:
                    self._wake_owner_queue(membership.job_id)
        finally:
            try:
                if membership is None and warm is not None:
                    self.warm.keep(warm)  # (with its uid)
                elif identity is not None:
                    identity.release()
            finally:
                if devices is not None:
                    devices.release()
                self.warm.prepare()  # (none is prepared after a job that never started)
                self.warm.wait_until_ready()  # (the next message: to a slot that is ready)

    def _decline(self, job_id: str, reason: str) -> None:
        """Hand the message's job back for another worker (a gang's copy is passed on)."""
        shape = self.admission.shape(job_id)
        if shape is not None and shape.assembling:
            self.gang.pass_on(job_id, reason)
        else:
            self.admission.hand_back(job_id, reason)

    def _take_next(
        self, job_id: str, prefer: tuple[str, ...] = ()
    ) -> tuple[Membership | None, DeviceSet | None]:
        """What this worker runs for a message: its part of a job (see :meth:`_claim_next`) and,
        on a worker with a device list, the devices that part holds. The claim runs under the
        machine's device allocation lock, holding every device free then: it takes the next job
        that fits those, keeps what that job needs and gives the rest back before the lock goes
        (the other slots wait for it, so two slots never pick jobs for the same devices): the
        ``prefer``-red ones (a warm sandbox's) when the job needs that many. A gang assembles
        after the lock, with its devices held."""
        if self.devices is None:
            return self._joined(self._claim_next(job_id, local_capacity(self.settings))), None
        full = local_capacity(self.settings)
        with self.devices.reserving_free() as free:
            capacity = Capacity(full.device_kind, min(full.device_count, len(free.devices)))
            claim = self._claim_next(job_id, capacity, busy_devices=capacity != full)
            if claim is None:
                free.release()
                return None, None
            shape = self.admission.shape(claim.job_id)
            free.keep(shape.needs.processes if shape is not None else capacity.device_count, prefer)
        logger.info("job %s: devices %s are its own", claim.job_id, free.visible_devices)
        self.warm.visible_devices = free.visible_devices
        try:
            membership = self._joined(claim)
        except BaseException:
            free.release()
            raise
        if membership is None:
            free.release()
            return None, None
        return membership, free

    def _joined(self, claim: Membership | NodeSeat | None) -> Membership | None:
        """A claimed part ready to run: a gang's seat once the whole gang is there."""
        if not isinstance(claim, NodeSeat):
            return claim
        if not self.gang.assemble(claim):
            return None
        return GangNode(self.gang, claim, self.outcomes)

    def _claim_next(
        self, job_id: str, capacity: Capacity, busy_devices: bool = False
    ) -> Membership | NodeSeat | None:
        """Join the oldest gang still assembling, or claim the next job of the fair order that
        fits ``capacity`` (a multi-node one as its leader: its seat, to assemble); None when
        there is none."""
        seat = self.gang.join_oldest(capacity)
        if seat is not None:
            self._keep_message(job_id, seat.job_id)
            return seat
        with self.sessions() as session:
            # The job names this worker by its registry id (the gang's node id), so that the
            # reconciler re-queues it as soon as that row goes stale (ace3_control.orphans); a
            # supervisor without a registration names its process instead.
            claimed = scheduling.claim_next(
                session,
                capacity,
                self.gang.worker_id,
                self.settings.lease_seconds,
                node_id=self.gang.worker_id,
                message_job_id=job_id,
            )
            if claimed is not None and claimed.nodes > 1:
                self.gang.add_leader(session, claimed.job_id, claimed.attempt)
            session.commit()
        if claimed is None:
            self._nothing_to_claim(job_id, busy_devices)
            return None
        self._keep_message(job_id, claimed.job_id)
        if claimed.nodes == 1:
            return SingleNode(
                claimed.job_id,
                claimed.attempt,
                self.settings,
                self.sessions,
                self.outcomes,
                self.watcher,
            )
        return self.gang.led(claimed.job_id, claimed.attempt, claimed.nodes)

    def _keep_message(self, message_job_id: str, taken_job_id: str) -> None:
        """This worker took another job than the message's: the message's job, still queued,
        gets a message again at once. (The taken job's own message would serve it, but that
        message may reach a worker where nothing fits, which drops it: the job would then wait
        for the reconciler.) A spare message costs a worker one look at the queue."""
        if taken_job_id == message_job_id:
            return
        try:  # (never in the way of the job just taken: the reconciler is the fallback)
            with self.sessions() as session:
                state = session.scalar(select(Job.state).where(Job.id == message_job_id))
        except Exception:
            logger.exception("job %s: could not look it up to send it again", message_job_id)
            return
        if state == JobState.QUEUED:
            publish(self.settings, message_job_id, on_failure="the reconciler will publish it")

    def _nothing_to_claim(self, job_id: str, busy_devices: bool = False) -> None:
        """No queued job fits this worker within its owner's quota: a message's job that does
        not fit here goes back for another worker (also one that fits only once this worker's
        busy devices are free: it is never held waiting); one that waits for its owner's quota
        stays queued (a job of the owner that ends, or the reconciler, publishes it again)."""
        reason = self.admission.unfit(self.admission.shape(job_id))
        if reason is None and busy_devices:
            reason = "this worker's free devices are fewer than it needs now (others run jobs)"
        if reason is not None:
            self._decline(job_id, reason)
            return
        logger.info(
            "message of job %s: no queued job this worker can claim now (taken, cancelled, or "
            "waiting for its owner's quota)",
            job_id,
        )

    def _wake_owner_queue(self, job_id: str) -> None:
        """A job ended: its owner's quota may let their next queued job run; say so."""
        try:
            with self.sessions() as session:
                owner_id = session.scalar(select(Job.owner_id).where(Job.id == job_id))
                waiting = (
                    None
                    if owner_id is None
                    else session.scalar(scheduling.first_queued_of(owner_id))
                )
        except Exception:
            logger.exception("job %s: could not look for its owner's next job", job_id)
            return
        if waiting is not None:
            publish(self.settings, waiting, on_failure="the reconciler will publish it")


def run_job(job_id: str, node_id: str | None = None) -> None:
    """Run one message's job on a supervisor of its own (the Celery task keeps one per worker
    process instead: :mod:`ace3_worker.tasks`)."""
    Supervisor(get_settings(), node_id).run(job_id)
