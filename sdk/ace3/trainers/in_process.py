"""Glue between :class:`ace3.Trainer` and the in-process engine (:mod:`ace3.runtime.in_process`).

Turns the trainer's objects (a :class:`~ace3.trainers.run_objects.TrainerObjects`) into engine hooks (callbacks, loggers), picks the checkpoint
directory and the checkpoint to resume from, and tells active profilers what ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ace3.config import ConfigProblem, TrainingConfig
from ace3.config.requirements import RequirementError, unmet_requirements
from ace3.errors import UnmetRequirementsError, UnsupportedFeatureError
from ace3.follow.job_handle import MetricsView, best_validation
from ace3.trainers.teacher_weights import teacher_weights_for_local_run
from ace3.trainers.weights import weights_for_local_run

if TYPE_CHECKING:
    from ace3.runtime.in_process import InProcessRun
    from ace3.trainers.run_objects import TrainerObjects


@dataclass
class LocalTrainingResult(MetricsView):
    """What an in-process run gives back; the same names as a remote job's result.

    ``history``: metric name -> ``[(step, value), ...]``; ``final_metrics`` (also attributes:
    ``result.val_loss``); ``best_val_accuracy`` / ``best_val_loss``; ``checkpoints``: the files
    written (with a ``save_dir``); ``best_checkpoint``: the best one by ``checkpoint_monitor``
    (with ``keep_best_checkpoint``); ``model``: the trained module (the one you passed);
    ``instabilities``: the instability guard's records (``ace3.config.events.InstabilityRecord``:
    step, action, reason, ...), in order.
    """

    model: Any
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    final_metrics: dict[str, Any] = field(default_factory=dict)
    best_val_accuracy: float | None = None
    best_val_loss: float | None = None
    checkpoints: list[Path] = field(default_factory=list)
    best_checkpoint: Path | None = None
    job_id: None = None
    instabilities: list[Any] = field(default_factory=list)

    @classmethod
    def of(cls, model: Any, run: InProcessRun) -> LocalTrainingResult:
        best_accuracy, best_loss = best_validation(run.history)
        return cls(
            model=model,
            history=run.history,
            final_metrics=run.final_metrics,
            best_val_accuracy=best_accuracy,
            best_val_loss=best_loss,
            checkpoints=run.checkpoints,
            best_checkpoint=run.best_checkpoint,
            instabilities=list(run.instabilities),
        )


def _resume_path(objects: TrainerObjects, resume: bool) -> Path | None:
    from ace3.runtime.in_process import latest_checkpoint_in

    checkpoint_dir = objects.checkpoint_dir
    if not resume:
        if objects.resume_source is not None:
            print(
                "note: a checkpoint was loaded with load_checkpoint() but train() was called "
                "without resume=True: training starts from the model's current weights",
                flush=True,
            )
        return None
    if objects.resume_source is not None:
        path = Path(objects.resume_source)
        if not path.is_file():
            raise FileNotFoundError(
                f"{objects.resume_source!r} is not a local checkpoint file: an in-process run "
                "resumes from a file (download a stored one with "
                "client.jobs.download_checkpoint(job_id, checkpoint_id, to=...))"
            )
        return path
    latest = latest_checkpoint_in(checkpoint_dir) if checkpoint_dir is not None else None
    if latest is None:
        where = f"in {checkpoint_dir}" if checkpoint_dir is not None else "(no save_dir is set)"
        raise FileNotFoundError(
            f"resume=True but there is no checkpoint to resume from {where}: call "
            "trainer.load_checkpoint(path) first"
        )
    return latest


def check_local_requirements(config: TrainingConfig) -> None:
    """``config.requirements`` against this Python, before anything runs: an entry it does not
    meet raises :class:`~ace3.errors.UnmetRequirementsError` naming it; one the service would
    refuse (a URL, a path, a pip option) :class:`~ace3.errors.UnsupportedFeatureError`.
    Nothing is installed into the user's Python."""
    try:
        unmet = unmet_requirements(config.requirements)
    except RequirementError as exc:
        raise UnsupportedFeatureError(
            str(exc), [ConfigProblem(field="requirements", reason=exc.reason)]
        ) from None
    if unmet:
        raise UnmetRequirementsError(unmet)


def run_locally(
    objects: TrainerObjects,
    config: TrainingConfig,
    model: Any,
    dataset: Any,
    validation_dataset: Any,
    resume: bool,
    compute_loss: Any,
    compute_metrics: Any,
) -> LocalTrainingResult:
    from ace3.runtime.in_process import train_in_process
    from ace3.runtime.observe.callback_hook import CallbackHook
    from ace3.training.profiling import MemoryProfiler, active_profilers

    check_local_requirements(config)
    if config.max_runtime_seconds is not None:
        raise UnsupportedFeatureError(
            "max_runtime_seconds is enforced by the service's workers, which stop a job that "
            "runs too long; an in-process run is yours to stop: leave it unset here",
            [ConfigProblem(field="max_runtime_seconds", reason="in-process runs have no worker")],
        )

    checkpoint_dir = objects.checkpoint_dir
    wants_files = [n for n in ("keep_best_checkpoint", "async_save") if getattr(config, n)]
    if checkpoint_dir is None and wants_files:
        raise UnsupportedFeatureError(
            f"{wants_files[0]}: this in-process run writes no checkpoint files; give "
            "checkpoint_config=ace3.CheckpointConfig(save_dir=...)",
            [ConfigProblem(field=name, reason="no save_dir") for name in wants_files],
        )
    resume_from = _resume_path(objects, resume)
    hooks: list[Any] = []
    if objects.callbacks:
        hooks.append(CallbackHook(list(objects.callbacks)))
    for logger in objects.loggers:
        hooks.extend(logger.engine_hooks(local=True))
    memory_profilers = [p for p in active_profilers() if isinstance(p, MemoryProfiler)]

    def on_memory(final: Mapping[str, Any]) -> None:
        state_mb = final.get("state_memory_mb")
        if state_mb is not None:
            for profiler in memory_profilers:
                profiler.note_training_state(int(state_mb * 2**20))

    info = {"job_id": None, "config": config.model_dump(mode="json"), "where": "local"}
    for logger in objects.loggers:
        logger.start(info)
    status = "failed"
    try:
        with (
            weights_for_local_run(config, objects.client) as init_from,
            teacher_weights_for_local_run(config, objects.client) as config,
        ):
            run = train_in_process(
                config, model, dataset, validation_dataset,
                hooks=hooks, checkpoint_dir=checkpoint_dir,
                keep_checkpoints=config.max_checkpoints, resume_from=resume_from,
                # (a LoRA checkpoint holds the adapters alone: its base is init_from's again)
                init_from=init_from if resume_from is None or config.lora else None,
                compute_loss=compute_loss, compute_metrics=compute_metrics, on_memory=on_memory,
            )  # fmt: skip
        status = "succeeded"
        return LocalTrainingResult.of(model, run)
    finally:
        for logger in objects.loggers:
            logger.finish(status)
