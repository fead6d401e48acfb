"""Running one attempt of the part of a job this worker took (:class:`AttemptRunner`): its
directory prepared (:mod:`ace3_worker.workspace`), torchrun started warm or cold
(:mod:`ace3_worker.warm`, :mod:`ace3_worker.launch`), watched (:mod:`ace3_worker.watch`), what
is left of its output stored (:mod:`ace3_worker.ingest`), and its exit reported through the
membership (:mod:`ace3_worker.membership`). The directory goes on every path, and torchrun's
sandbox is dead before the attempt is recorded. The directory is held in use
(:mod:`ace3_worker.attempt_dirs`) from before it is prepared until it is gone; the first
attempt a worker process runs first removes those that a dead worker left, and what a dead
worker left of its environment installs and builds (:meth:`AttemptRunner.sweep`).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ace3_control.models import Job
from ace3_control.settings import Settings
from ace3_worker import reports
from ace3_worker.attempt_dirs import hold_attempt, sweep_attempts, warn_if_copies
from ace3_worker.device import worker_device
from ace3_worker.environments.cache import EnvironmentCache
from ace3_worker.environments.scratch import sweep_build_scratch
from ace3_worker.environments.uv_commands import (
    EnvironmentBuildError,
    EnvironmentRefusedError,
    PreparationInterrupted,
)
from ace3_worker.gpu_sets import DeviceSet
from ace3_worker.ingest import Ingest, JobOutput, service_line
from ace3_worker.job_dir import JobDirectory, remove_attempt_directory
from ace3_worker.launch import RunningTorchrun, job_environment, start_torchrun
from ace3_worker.membership import Membership
from ace3_worker.sandbox.identity import JobIdentity
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.shard_feed import ShardFeed
from ace3_worker.usage_monitor import UsageMonitor
from ace3_worker.warm import WarmSlot
from ace3_worker.warm_sandbox import WarmSandbox
from ace3_worker.watch import AttemptWatch, RunState, Watcher, apply_beat, kill_for, stop_for
from ace3_worker.workspace import Workspace

logger = logging.getLogger(__name__)


class AttemptRunner:
    """Runs the attempts of the parts a supervisor took, one at a time."""

    def __init__(
        self,
        settings: Settings,
        workspace: Workspace,
        warm: WarmSlot,
        limits: JobLimits,
        watcher: Watcher,
        ingest: Ingest,
    ) -> None:
        self.settings = settings
        self.workspace = workspace
        self.warm = warm
        self.limits = limits
        self.watcher = watcher
        self.ingest = ingest
        self._swept = False

    def sweep(self) -> None:
        """Once per worker process: remove the attempt directories no live worker holds (a
        crashed one's, whose shard links would pin cache entries), the environment cache's
        half-done installs and the environment build scratch directories no live process holds
        (a killed one's, uncounted and never removed otherwise), and say when shards will be
        copied into jobs rather than linked."""
        if self._swept:
            return
        self._swept = True
        work_dir = self.settings.resolved_work_dir
        sweep_attempts(work_dir)
        try:
            EnvironmentCache(
                self.settings.resolved_env_cache_dir, self.settings.env_cache_bytes
            ).sweep()
            sweep_build_scratch(work_dir)
        except Exception:  # (a sweep never stops an attempt: the next process sweeps again)
            logger.exception("could not sweep the environment cache and build directories")
        warn_if_copies(self.settings.resolved_dataset_cache_dir, work_dir)

    def run(
        self,
        membership: Membership,
        identity: JobIdentity | None,
        devices: DeviceSet | None,
        warm: WarmSandbox | None,
    ) -> None:
        """Prepare, run and record this worker's part (in ``warm``'s directory, when a sandbox
        was prepared); its directory goes on every path."""
        job_id, attempt = membership.job_id, membership.attempt
        root = self.workspace.attempt_root(job_id, attempt, membership.node_rank)
        self.sweep()
        with hold_attempt(root):
            self._run(membership, identity, devices, warm, root)

    def _run(
        self,
        membership: Membership,
        identity: JobIdentity | None,
        devices: DeviceSet | None,
        warm: WarmSandbox | None,
        root: Path,
    ) -> None:
        job_id, attempt = membership.job_id, membership.attempt
        directory: JobDirectory | None = None
        interrupt = threading.Event()  # (a cancel stops an environment's build at once)
        try:
            try:
                # (the lease is renewed meanwhile: building an environment may take minutes, and
                # none of it counts against max_runtime_seconds, whose clock starts at launch)
                with membership.keep_alive(interrupt):
                    job, directory = self.workspace.prepare(
                        job_id,
                        attempt,
                        identity,
                        node_rank=membership.node_rank,
                        skeleton=self.warm.skeleton_for(warm),
                        interrupt=interrupt,
                    )
                    device = worker_device(self.settings.worker_device)
            except PreparationInterrupted:
                logger.info("job %s: cancelled while its environment was prepared", job_id)
                membership.interrupted_outside_torchrun()
                return
            except EnvironmentBuildError as exc:
                logger.warning("job %s: its environment could not be built: %s", job_id, exc)
                membership.retry_outside_torchrun(
                    f"the job's environment could not be built: {exc}"
                )
                return
            except EnvironmentRefusedError as exc:
                # (not retried: the same requirements would fail again)
                logger.warning("job %s: its environment cannot be built: %s", job_id, exc)
                membership.failed_outside_torchrun(f"the job's environment cannot be built: {exc}")
                return
            except Exception as exc:
                logger.exception("job %s: could not prepare %s", job_id, membership.name)
                membership.failed_outside_torchrun(f"could not prepare the job: {exc}")
                return
            try:
                self._launch_and_watch(membership, job, directory, device, identity, devices, warm)
            except Exception as exc:
                logger.exception("job %s: the supervisor failed during %s", job_id, membership.name)
                membership.failed_outside_torchrun(f"the worker could not run the job: {exc}")
        finally:
            if warm is not None:
                self.warm.discard(warm, keep_identity=True)
            remove_attempt_directory(root)
            if directory is not None and directory.environment_pin is not None:
                directory.environment_pin.release()

    def _launch_and_watch(
        self,
        membership: Membership,
        job: Job,
        directory: JobDirectory,
        device: str,
        identity: JobIdentity | None,
        devices: DeviceSet | None = None,
        warm: WarmSandbox | None = None,
    ) -> None:
        with membership.keep_alive():  # (restoring large artifacts takes a while)
            artifacts = self.workspace.artifact_sync(job, membership.attempt, directory, identity)
        nproc = int(job.num_processes) // membership.nodes
        spec = membership.launch_spec(str(directory.visible(directory.job_file)), nproc)
        env = job_environment(
            self.settings,
            directory,
            identity,
            device=device,
            job_id=job.id,
            nproc=nproc,
            visible_devices=None if devices is None else devices.visible_devices,
            extra=spec.env,
        )

        def cold() -> RunningTorchrun:
            return start_torchrun(
                self.settings,
                self.workspace.plan,
                self.limits,
                spec,
                env,
                directory=directory,
                identity=identity,
                device=device,
            )

        running, path = self.warm.start(warm, spec, env, cold)
        try:  # (until the watch loop, which stops it on every path, owns it)
            logger.info("job %s %s: %s", job.id, membership.name, path.removeprefix("ace3: "))
            running.lines.put(service_line(path))
            self.warm.prepare()  # the next job's, while this one runs
            watch = AttemptWatch(
                job.id,
                membership.attempt,
                output=JobOutput(syncs_artifacts=membership.hosts_rank_zero),
                # (a draining worker lets gangs run to the end)
                run=RunState(preemptible=membership.nodes == 1),
            )
            events = reports.EventTail(directory.output_dir)
            membership.started()
        except BaseException:
            running.stop()
            raise

        def beat() -> None:
            apply_beat(watch, membership.beat(), running.process, membership.name)

        feed = self._feed(job, directory, watch, running)
        usage = self._usage_monitor(directory, watch, running, identity)
        try:
            returncode = self.watcher.watch(job, directory, watch, running, events, artifacts, beat)
        finally:
            usage.stop()
            if feed is not None:
                feed.stop()

        def drain() -> None:
            while self.ingest.store_batch(
                job, directory, watch, running.lines, events, running.limiter
            ):
                pass

        with membership.keep_alive():
            if not watch.run.lease_lost and watch.output.syncs_artifacts:
                self.ingest.final_artifact_sync(artifacts, running.lines)
            self.watcher.through_outage(watch, beat, drain)
            membership.report(job, watch, returncode, events, beat)
            # (a gang's leader records the attempt here: registering a succeeded run's export
            # copies the whole model, so the lease is kept alive meanwhile)
            membership.decide(watch)

    def _usage_monitor(
        self,
        directory: JobDirectory,
        watch: AttemptWatch,
        running: RunningTorchrun,
        identity: JobIdentity | None,
    ) -> UsageMonitor:
        """The attempt's disk and memory measurements, started: a limit the job passes kills
        the attempt at once, saying so in its log (:mod:`ace3_worker.usage_monitor`)."""

        def on_limit(reason: str, out_of_memory: bool) -> None:
            logger.warning("job %s attempt %d: %s", watch.job_id, watch.attempt, reason)
            running.lines.put(service_line(f"ace3: stopping the attempt: {reason}"))
            kill_for(watch, running.process, reason, out_of_memory=out_of_memory)
            running.activity.set()

        uid = identity.uid if identity is not None else None
        return UsageMonitor(self.limits, directory, running.process, uid, on_limit).start()

    def _feed(
        self, job: Job, directory: JobDirectory, watch: AttemptWatch, running: RunningTorchrun
    ) -> ShardFeed | None:
        """The attempt's shard feeder, started, when it streams a dataset: its lines go to the
        job's log, a shard it cannot give the job stops the attempt (the job fails saying so)."""
        if not directory.streams:
            return None

        def log(text: str) -> None:
            running.lines.put(service_line(text))
            running.activity.set()

        def fail(reason: str) -> None:
            stop_for(watch, running.process, reason)
            running.activity.set()

        return ShardFeed.for_attempt(
            self.settings,
            directory.streams,
            directory.output_dir,
            log=log,
            fail=fail,
            job_id=job.id,
            readers=directory.readers,
        ).start()
