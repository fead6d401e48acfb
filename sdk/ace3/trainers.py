"""Trainers: submit a training job to the ACE3 service and follow it until it ends.

Every trainer runs remotely the same way (upload what is missing, submit one job, stream its
progress); the parallel flavours only check that the config asks for their kind of
parallelism. Settings this version does not implement are refused, with the reason, before
anything is uploaded or submitted: never silently ignored.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ace3._submit import (
    refuse_unsupported,
    resolve_inputs,
    without_rendezvous,
)
from ace3.config import DistributedConfig, TrainingConfig
from ace3.errors import UnsupportedFeatureError
from ace3.results import JobHandle, TrainingResult

if TYPE_CHECKING:
    from ace3.client import Client

__all__ = [
    "DataParallelTrainer",
    "DistributedTrainer",
    "ModelParallelTrainer",
    "PipelineParallelTrainer",
    "Trainer",
]

# Trainer arguments that are accepted by name but not implemented yet, and what to do instead.
_NOT_IMPLEMENTED_ARGUMENTS = {
    "amp_config": "use TrainingConfig(mixed_precision=True, amp_dtype=..., amp_level='O1')",
    "scheduler": "learning-rate schedulers are not implemented yet",
    "logger": "metrics are stored by the service: read result.history or client.jobs.metrics()",
    "callbacks": "callbacks are not implemented yet",
    "checkpoint_config": "use TrainingConfig(save_interval=..., max_checkpoints=...)",
}

ModelInput = Any  # ModelRef | Model | str | os.PathLike
DatasetInput = Any  # DatasetRef | Dataset | str | os.PathLike


class Trainer:
    """Train a model on the ACE3 service.

    ``config`` is a :class:`~ace3.TrainingConfig` (or a :class:`~ace3.DistributedConfig`,
    converted). ``client`` defaults to the client that loaded the model, else the default
    client. ``amp_config``, ``scheduler``, ``logger``, ``callbacks`` and
    ``checkpoint_config`` are not implemented yet: passing one raises
    :class:`~ace3.errors.UnsupportedFeatureError`.
    """

    #: the parallelism this trainer runs; None accepts any value of the config
    parallelism: ClassVar[str | None] = None

    def __init__(
        self,
        config: TrainingConfig | DistributedConfig | Mapping[str, Any] | None = None,
        *,
        client: Client | None = None,
        amp_config: Any = None,
        scheduler: Any = None,
        logger: Any = None,
        callbacks: Any = None,
        checkpoint_config: Any = None,
    ):
        given = {
            "amp_config": amp_config,
            "scheduler": scheduler,
            "logger": logger,
            "callbacks": callbacks,
            "checkpoint_config": checkpoint_config,
        }
        refused = [argument for argument, value in given.items() if value is not None]
        if refused:
            problems = [
                f"{argument}: not implemented yet ({_NOT_IMPLEMENTED_ARGUMENTS[argument]})"
                for argument in refused
            ]
            raise UnsupportedFeatureError(
                f"{type(self).__name__}({', '.join(a + '=...' for a in refused)}) is not "
                "implemented yet in this version:\n  - " + "\n  - ".join(problems),
                problems,
            )
        self.config = self._to_training_config(config)
        self._check_parallelism(self.config)
        self.client = client
        self.last_job: JobHandle | None = None

    # -- configuration --------------------------------------------------------------------

    @classmethod
    def _to_training_config(cls, config: Any) -> TrainingConfig:
        overrides = {"parallelism": cls.parallelism} if cls.parallelism else {}
        if config is None:
            return TrainingConfig(**overrides)
        if isinstance(config, TrainingConfig):
            return config.model_copy(deep=True)
        if isinstance(config, DistributedConfig):
            return config.to_training_config(**overrides)
        if isinstance(config, Mapping):
            return TrainingConfig(**{**overrides, **config})
        raise TypeError(
            f"config must be an ace3.TrainingConfig or ace3.DistributedConfig, "
            f"not {type(config).__name__}"
        )

    @classmethod
    def _check_parallelism(cls, config: TrainingConfig) -> None:
        if cls.parallelism is None or config.parallelism == cls.parallelism:
            return
        matching = _TRAINER_FOR.get(config.parallelism, "Trainer")
        raise ValueError(
            f"{cls.__name__} runs parallelism={cls.parallelism!r}, but the config sets "
            f"parallelism={config.parallelism!r}: use ace3.{matching} for that config, or set "
            f"parallelism={cls.parallelism!r}"
        )

    def resolve_config(self, epochs: int | None = None) -> TrainingConfig:
        """The exact config a job would be submitted with (``epochs`` overriding).

        Raises :class:`~ace3.errors.UnsupportedFeatureError` listing every setting the engine
        does not implement yet; warns that rendezvous settings are the service's to choose.
        """
        config = self.config
        self._check_parallelism(config)
        if epochs is not None:
            config = TrainingConfig(**{**config.model_dump(), "epochs": epochs})
        refuse_unsupported(config)
        return without_rendezvous(config)

    # -- training -------------------------------------------------------------------------

    def train(
        self,
        model: ModelInput = None,
        dataset: DatasetInput = None,
        *,
        train_dataset: DatasetInput = None,
        validation_dataset: DatasetInput = None,
        epochs: int | None = None,
        model_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        wait: bool = True,
        show_progress: bool = True,
        idempotency_key: str | None = None,
        resume: bool = False,
    ) -> TrainingResult | JobHandle:
        """Submit a training job and, with ``wait=True``, follow it to the end.

        ``model``: a :class:`~ace3.client.ModelRef` from ``client.load_model`` (or a path,
        loaded here); ``dataset`` (or ``train_dataset``) and ``validation_dataset``: a
        :class:`~ace3.client.DatasetRef` or a path. ``epochs`` overrides ``config.epochs``.

        Returns a :class:`~ace3.TrainingResult` when the job succeeds; raises
        :class:`~ace3.errors.JobFailedError` (with its last log lines) or
        :class:`~ace3.errors.JobCancelledError`. Ctrl-C while waiting cancels the job.
        ``wait=False`` returns a :class:`~ace3.JobHandle` at once. ``idempotency_key``
        (a new uuid4 by default) makes a retried submission return the same job.
        """
        if resume:
            raise UnsupportedFeatureError(
                "resume=True is not implemented yet: resuming from a checkpoint arrives with "
                "the engine's resume support; start a new job for now"
            )
        config = self.resolve_config(epochs)
        if dataset is not None and train_dataset is not None:
            raise ValueError("pass the training data as dataset or train_dataset, not both")
        training_data = dataset if dataset is not None else train_dataset
        if model is None:
            raise ValueError("model is required: pass client.load_model('model.py') or a path")
        if training_data is None:
            raise ValueError("a dataset is required: pass dataset= (or train_dataset=)")

        client, ids = resolve_inputs(self.client, model, training_data, validation_dataset)
        job = client.jobs.create(
            **ids,
            config=config,
            model_kwargs=model_kwargs,
            name=name,
            idempotency_key=idempotency_key or str(uuid.uuid4()),
        )
        handle = JobHandle(job, client)
        self.last_job = handle
        if not wait:
            return handle
        return handle.wait(show_progress=show_progress, cancel_on_interrupt=True)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Not implemented yet: resuming from a checkpoint arrives with the engine's resume
        support."""
        raise UnsupportedFeatureError(
            f"load_checkpoint({os.fspath(path)!r}) is not implemented yet: resuming from a "
            "checkpoint arrives with the engine's resume support"
        )


class DistributedTrainer(Trainer):
    """Train across several processes (``num_gpus`` per node); any parallelism value."""


class DataParallelTrainer(Trainer):
    """Data parallel (DDP): every process holds the model and sees a slice of each batch."""

    parallelism = "data"


class ModelParallelTrainer(Trainer):
    """Model parallel: the model is split across devices (not implemented by the engine yet)."""

    parallelism = "model"


class PipelineParallelTrainer(Trainer):
    """Pipeline parallel: stages across devices (not implemented by the engine yet)."""

    parallelism = "pipeline"


_TRAINER_FOR = {
    "data": "DataParallelTrainer",
    "model": "ModelParallelTrainer",
    "pipeline": "PipelineParallelTrainer",
}
