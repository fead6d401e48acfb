"""An attempt's workspace on this worker: the uid it runs as, its job directory (inputs copied
out of the store, the checkpoint it resumes from, the environment of the packages it asked for)
and its artifacts restored for a re-queued attempt.

The directory itself is built by :mod:`ace3_worker.job_dir`; the artifact sync is
:mod:`ace3_worker.artifact_sync`. This module decides what goes in (which checkpoint, which
owner) and reads the rows it needs.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from ace3_control.models import Job, JobCheckpoint, StoredDataset, StoredModel
from ace3_control.settings import Settings
from ace3_control.storage import ArtifactStore
from ace3_control.stored_weights import StoredWeights, required_weights
from ace3_worker import checkpoints
from ace3_worker.artifact_sync import ArtifactSync
from ace3_worker.environments.prepare import EnvironmentPreparer, PreparedEnvironment
from ace3_worker.environments.service_log import ServiceLog
from ace3_worker.job_dir import (
    JobDirectory,
    JobOwner,
    attempt_path,
    hand_over,
    needs_initial_weights,
    prepare_job_directory,
)
from ace3_worker.sandbox.identity import JobIdentity, lease_identity
from ace3_worker.sandbox.plan import SandboxPlan, sandbox_plan
from ace3_worker.teacher_inputs import teacher_rows

logger = logging.getLogger(__name__)


def resume_checkpoint(session: Session, job: Job, attempt: int) -> JobCheckpoint | None:
    """What an attempt resumes from: after the first, the job's own newest checkpoint when it
    has one; else the stored checkpoint the job was created from (``resume_from_checkpoint``)."""
    if attempt > 1:
        own = checkpoints.latest_checkpoint(session, job.id)
        if own is not None:
            return own
    if job.resume_from_checkpoint_id is None:
        return None
    origin = session.get(JobCheckpoint, job.resume_from_checkpoint_id)
    if origin is None:
        raise FileNotFoundError(
            f"checkpoint {job.resume_from_checkpoint_id}, which this job starts from, is gone"
        )
    return origin


def initial_weights(session: Session, job: Job) -> StoredWeights | None:
    """The weights the job starts from (``config.init_from_checkpoint_id``), checked again to
    belong to the job's owner."""
    checkpoint_id = (job.config or {}).get("init_from_checkpoint_id")
    if not checkpoint_id:
        return None
    return required_weights(
        session, job.owner_id, str(checkpoint_id), "whose weights this job starts from"
    )


def job_owner(identity: JobIdentity | None) -> JobOwner | None:
    """Who owns what the job may write (None: the worker's own uid)."""
    return JobOwner(identity.uid, identity.gid, identity.user_name) if identity else None


class Workspace:
    """Prepares attempts' directories under the worker's work dir."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        store: ArtifactStore,
        worker_id: str = "",
    ) -> None:
        """``worker_id``: this worker process, as an environment's build row names it."""
        self.settings = settings
        self.sessions = sessions
        self.store = store
        self.environments = EnvironmentPreparer(
            settings, sessions, store, lambda: self.plan, worker_id
        )

    @property
    def plan(self) -> SandboxPlan:
        """This worker's sandbox (decided and checked once per process)."""
        return sandbox_plan(self.settings)

    def lease_identity(self) -> JobIdentity | None:
        """The uid the next attempt runs as (None: the worker's own; no dedicated uids).
        Raises NoFreeIdentityError when every uid is leased."""
        if not self.plan.dedicated_uids:
            return None
        settings = self.settings
        return lease_identity(
            settings.sandbox_lock_dir, settings.sandbox_uid_base, settings.sandbox_uid_count
        )

    def attempt_root(self, job_id: str, attempt: int, node_rank: int | None) -> Path:
        """Where the attempt's (node's) directory is, removed on every path after it."""
        return attempt_path(self.settings.resolved_work_dir, job_id, attempt, node_rank)

    def prepare(
        self,
        job_id: str,
        attempt: int,
        identity: JobIdentity | None = None,
        node_rank: int | None = None,
        skeleton: Path | None = None,
        interrupt: threading.Event | None = None,
    ) -> tuple[Job, JobDirectory]:
        """The attempt's job and its directory (made of ``skeleton``, a warm sandbox's, when
        given: :func:`ace3_worker.job_dir.prepare_job_directory`), with the environment of the
        packages the job asked for linked in, pinned in the cache (``directory.environment_pin``,
        released by the caller once the attempt is over). ``interrupt``: set, it stops the
        environment's build or the wait for another's
        (:class:`~ace3_worker.environments.uv_commands.PreparationInterrupted`)."""
        environment = self.prepare_environment(job_id, attempt, interrupt)
        try:
            job, directory = self._prepare(
                job_id, attempt, identity, node_rank, skeleton, environment
            )
        except BaseException:
            if environment is not None:
                environment.release()
            raise
        directory.environment_pin = environment.pin if environment is not None else None
        return job, directory

    def prepare_environment(
        self, job_id: str, attempt: int, interrupt: threading.Event | None = None
    ) -> PreparedEnvironment | None:
        """The environment of the packages the job asks for (``jobs.requirements``), built,
        fetched or found in the cache (:mod:`ace3_worker.environments`); None: it asks for
        none. Raises :class:`~ace3_worker.environments.uv_commands.EnvironmentRefusedError`
        naming what cannot be installed."""
        with self.sessions() as session:
            job = session.get(Job, job_id)
            requirements = list(job.requirements or []) if job is not None else []
        if not requirements:
            return None
        log = ServiceLog(self.sessions, job_id, attempt)
        try:
            return self.environments.prepare(job_id, attempt, requirements, log, interrupt)
        finally:
            log.flush()

    def _prepare(
        self,
        job_id: str,
        attempt: int,
        identity: JobIdentity | None,
        node_rank: int | None,
        skeleton: Path | None,
        environment: PreparedEnvironment | None,
    ) -> tuple[Job, JobDirectory]:
        with self.sessions() as session:
            job = session.get(Job, job_id)
            assert job is not None
            model = session.get(StoredModel, job.model_id)
            dataset = session.get(StoredDataset, job.dataset_id)
            validation = (
                session.get(StoredDataset, job.validation_dataset_id)
                if job.validation_dataset_id
                else None
            )
            if model is None or dataset is None:
                raise FileNotFoundError("the job's model or dataset record is gone")
            resume_from = resume_checkpoint(session, job, attempt)
            directory = prepare_job_directory(
                self.settings.resolved_work_dir,
                self.store,
                job,
                attempt,
                model,
                dataset,
                validation,
                resume_from,
                node_rank,
                visible_root=self.plan.visible_root,
                owner=job_owner(identity),
                init_from=(
                    initial_weights(session, job)
                    if needs_initial_weights(job, resume_from)
                    else None  # (pruned meanwhile or not: this attempt has no use for it)
                ),
                teacher=teacher_rows(session, job),
                skeleton=skeleton,
                dataset_cache_bytes=self.settings.dataset_cache_bytes,
                worker_slots=self.settings.worker_slots,
                environment=environment.path if environment is not None else None,
            )
            if resume_from is not None:
                logger.info("job %s attempt %d resumes from %s", job_id, attempt, resume_from.name)
            return job, directory

    def artifact_sync(
        self,
        job: Job,
        attempt: int,
        directory: JobDirectory,
        identity: JobIdentity | None = None,
    ) -> ArtifactSync:
        """The attempt's artifact sync, with the job's recorded artifacts restored into its
        (fresh) artifacts directory, so a re-queued attempt continues them."""
        sync = ArtifactSync(
            job.id, attempt, directory.artifacts_dir, self.store, self.settings.max_artifact_bytes
        )
        with self.sessions() as session:
            sync.load(session)
        if sync.recorded:
            restored = sync.restore()
            hand_over(directory.artifacts_dir, job_owner(identity))
            logger.info("job %s attempt %d: restored %d artifact(s)", job.id, attempt, restored)
        return sync
