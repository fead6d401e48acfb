"""Glue between :class:`ace3.Trainer` and a remote job: carry the trainer's objects into the
job's config, submit, and follow the job while filling the user's local directories.

While the job runs, the follower (:class:`JobFollower`) hands every metrics step to the
loggers (on this machine: custom metrics and W&B credentials stay here), copies TensorBoard
and ModelCheckpoint files the job writes into the local paths the user gave, and downloads
checkpoints into ``checkpoint_config.save_dir``. When the job ends, active profilers get the
job's trace and memory figures.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ace3.config import TrainingConfig
from ace3.config.checkpoint_names import CHECKPOINT_NAME_RE
from ace3.config.specs import ARTIFACT_SCHEME
from ace3.errors import JobCancelledError, UnsupportedFeatureError
from ace3.files import sha256_file
from ace3.follow.job_handle import JobHandle
from ace3.trainers._submit import refuse_local_only, resolve_client, resolve_inputs
from ace3.trainers.teacher_weights import upload_teacher_weights
from ace3.trainers.weights import upload_local_weights

if TYPE_CHECKING:
    from ace3.client import Client
    from ace3.client.types import JobEvent
    from ace3.follow.job_handle import TrainingResult
    from ace3.trainers.run_objects import TrainerObjects

SYNC_EVERY_S = 2.0
# The engine's checkpoint names: step-XXXXXXXX.pt, or step-XXXXXXXX.dcp.tar for sharded jobs.


class RemotePlan:
    """The job config with the trainer's objects carried in, and where their files go."""

    def __init__(self, objects: TrainerObjects, config: TrainingConfig) -> None:
        from ace3.training.callbacks.transport import callback_spec
        from ace3.training.profiling import active_training_profilers, combined_remote_spec

        self.artifact_dirs: dict[str, Path] = {}
        fields: dict[str, Any] = {}
        specs = []
        from ace3.training.callbacks.model_checkpoint import ModelCheckpoint

        for index, callback in enumerate(objects.callbacks):
            spec = callback_spec(callback)
            is_checkpoint = isinstance(callback, ModelCheckpoint)
            filepath = spec.params.get("filepath") if is_checkpoint else None
            if isinstance(filepath, str) and not filepath.startswith(ARTIFACT_SCHEME):
                prefix = f"model_checkpoint_{index}"
                local_dir, template = os.path.split(filepath)
                if "{" in local_dir:
                    raise UnsupportedFeatureError(
                        f"ModelCheckpoint filepath {filepath!r}: for a remote job only the file "
                        "name may hold {...} fields, not the directory"
                    )
                self.artifact_dirs[prefix] = Path(local_dir or ".").expanduser().resolve()
                spec = spec.model_copy(
                    update={
                        "params": {
                            **spec.params,
                            "filepath": f"{ARTIFACT_SCHEME}{prefix}/{template}",
                        }
                    }
                )
            specs.append(spec)
        if specs:
            fields["callbacks"] = specs
        if config.tensorboard is not None and not config.tensorboard.log_dir.startswith(
            ARTIFACT_SCHEME
        ):
            self.artifact_dirs["tensorboard"] = (
                Path(config.tensorboard.log_dir).expanduser().resolve()
            )
            fields["tensorboard"] = config.tensorboard.model_copy(
                update={"log_dir": ARTIFACT_SCHEME + "tensorboard"}
            )
        self.profilers = active_training_profilers()
        self.profile_dir: Path | None = None
        if self.profilers:
            self.profile_dir = Path(tempfile.mkdtemp(prefix="ace3-profile-"))
            profiler = combined_remote_spec(self.profilers)  # (None only for no profilers)
            if profiler is not None:
                fields["profiler"] = profiler.model_copy(
                    update={"output_dir": ARTIFACT_SCHEME + "profiler"}
                )
            self.artifact_dirs["profiler"] = self.profile_dir
        self.config = TrainingConfig(**{**config.model_dump(), **fields}) if fields else config


def _checkpoint_id_for(client: Client, value: str) -> str:
    """A stored checkpoint's id from an id, or from a local file with the same sha256."""
    path = Path(value)
    if not path.is_file():
        return value  # an id: the server checks it (404 when unknown)
    digest = sha256_file(path)
    found = client.checkpoints.find(sha256=digest)
    if not found:
        raise UnsupportedFeatureError(
            f"{value} (sha256 {digest[:12]}…) is not a checkpoint stored on the service: a "
            "remote job resumes from a stored checkpoint (one the SDK downloaded, or an id from "
            "result.checkpoints); to continue a local run, train locally with the live module"
        )
    return found[0].id


def _resume_checkpoint(objects: TrainerObjects, client: Client, resume: bool) -> str | None:
    if not resume:
        return None
    if objects.resume_source is not None:
        return _checkpoint_id_for(client, objects.resume_source)
    directory = objects.checkpoint_dir
    if directory is not None:
        files = sorted(
            (int(m.group(1)), path)
            for path in directory.iterdir()
            if (m := CHECKPOINT_NAME_RE.match(path.name))
        )
        if files:
            found = client.checkpoints.find(sha256=sha256_file(files[-1][1]))
            if found:
                return found[0].id
    raise FileNotFoundError(
        "resume=True but there is no checkpoint to resume from: call "
        "trainer.load_checkpoint(path_or_id) first"
    )


class JobFollower:
    """Runs on every event of a followed job (see the module docstring)."""

    def __init__(self, objects: TrainerObjects, plan: RemotePlan, handle: JobHandle) -> None:
        from ace3.trainers.downloads import ArtifactSync, CheckpointSync

        self.loggers, self.plan, self.handle = objects.loggers, plan, handle
        client = handle.client
        self.artifacts = (
            ArtifactSync(client, handle.id, plan.artifact_dirs) if plan.artifact_dirs else None
        )
        save_dir = objects.checkpoint_dir  # CheckpointConfig.save_dir or a logger's
        self.checkpoints = (
            CheckpointSync(client, handle.id, save_dir, max_checkpoints=plan.config.max_checkpoints)
            if save_dir is not None
            else None
        )
        self.pending_step: int | None = None
        self.pending: dict[str, float] = {}
        self.pending_epoch = 0
        self.last_sync = 0.0

    def start(self) -> None:
        info = {
            "job_id": self.handle.id,
            "config": self.plan.config.model_dump(mode="json"),
            "where": "remote",
        }
        for logger in self.loggers:
            logger.start(info)

    def _flush_metrics(self) -> None:
        if self.pending_step is None or not self.pending:
            return
        for logger in self.loggers:
            logger.log_metrics(self.pending_step, self.pending_epoch, dict(self.pending))
        self.pending = {}

    def on_event(self, event: JobEvent) -> None:
        from ace3.client.types import Metric

        if event.type == "metric" and isinstance(event.data, Metric):
            metric = event.data
            if metric.step != self.pending_step:
                self._flush_metrics()
                self.pending_step = metric.step
            self.pending[metric.name] = metric.value
            self.pending_epoch = int(metric.epoch or 0)
        now = time.monotonic()
        if now - self.last_sync >= SYNC_EVERY_S:
            self.last_sync = now
            self.sync()

    def sync(self) -> None:
        if self.artifacts is not None:
            self.artifacts.sync()
        if self.checkpoints is not None:
            self.checkpoints.sync()

    def finish(self, status: str, final_metrics: dict[str, Any] | None) -> None:
        from ace3.training.profiling import MemoryProfiler, active_profilers

        self._flush_metrics()
        self.sync()
        for logger in self.loggers:
            logger.finish(status)
        profile_dir = self.plan.profile_dir
        try:
            if status == "succeeded" and profile_dir is not None:
                for profiler in self.plan.profilers:
                    profiler.load_remote(profile_dir, self.handle.id)  # copies what it keeps
        finally:
            if profile_dir is not None:
                shutil.rmtree(profile_dir, ignore_errors=True)
        if status != "succeeded":
            return
        for profiler in active_profilers():
            if isinstance(profiler, MemoryProfiler):
                profiler.note_job_summary(self.handle.id, dict(final_metrics or {}))


def submit_job(
    objects: TrainerObjects,
    config: TrainingConfig,
    model: Any,
    dataset: Any,
    validation_dataset: Any,
    *,
    model_kwargs: Mapping[str, Any] | None,
    name: str | None,
    priority: str | None = None,
    idempotency_key: str,
    resume: bool,
) -> tuple[JobHandle, RemotePlan]:
    """Carry the objects into ``config``, upload what is missing, submit one job: its handle
    and the plan :func:`follow_job` follows it with. Refusals come before any upload."""
    plan = RemotePlan(objects, config)
    refuse_local_only(plan.config)  # before any upload
    client = resolve_client(objects.client, model, dataset, validation_dataset)
    resume_id = _resume_checkpoint(objects, client, resume)  # before any upload
    _, ids = resolve_inputs(client, model, dataset, validation_dataset)
    job = client.jobs.create(
        **ids,
        config=upload_teacher_weights(upload_local_weights(plan.config, client), client),
        model_kwargs=model_kwargs,
        name=name,
        idempotency_key=idempotency_key,
        resume_from_checkpoint=resume_id,
        priority=priority,
    )
    return JobHandle(job, client), plan


def follow_job(
    objects: TrainerObjects, plan: RemotePlan, handle: JobHandle, *, show_progress: bool | None
) -> TrainingResult:
    """Wait for the job while the follower feeds the loggers and the local directories;
    Ctrl-C cancels the job. Its result, or the job's error."""
    follower = JobFollower(objects, plan, handle)
    follower.start()
    status = "failed"
    result = None
    try:
        result = handle.wait(
            show_progress=show_progress, cancel_on_interrupt=True, on_event=follower.on_event
        )
        status = "succeeded"
        return result
    except BaseException as exc:
        status = "cancelled" if isinstance(exc, JobCancelledError) else "failed"
        raise
    finally:
        follower.finish(status, result.final_metrics if result is not None else None)
