"""Trainers: train a model remotely on the ACE3 service, or in this process.

``trainer.train(model, dataset)`` runs **remotely** when ``model`` is a model stored on the
service (``client.load_model(...)``, or a path to upload): upload what is missing, submit one
job, stream its progress. It runs **in this process** (same engine, no server) when ``model``
is a live ``torch.nn.Module``.

Objects built on the client travel to a remote job by what they are, never pickled: an
optimizer or scheduler by class and hyperparameters, a callback by class (built-in) or by its
source code (your own subclass), a logger as the settings it implies plus a local follower
(metrics logged on your machine, TensorBoard files and ModelCheckpoint files copied into your
local directories as the job writes them). Settings this version does not implement are
refused, with the reason, before anything is uploaded or submitted: never silently ignored.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias, overload

from ace3.config import AMPConfig, CheckpointConfig, DistributedConfig, TrainingConfig
from ace3.follow.job_handle import JobHandle, TrainingResult
from ace3.trainers._submit import refuse_unsupported, without_rendezvous
from ace3.trainers.run_objects import TrainerObjects

if TYPE_CHECKING:
    import torch

    from ace3.client import Client, ModelRef
    from ace3.client.types import Model
    from ace3.trainers.in_process import LocalTrainingResult

__all__ = ["Trainer", "is_live_module"]

#: a model stored on the service (``client.load_model``) or a path to upload: a remote job
RemoteModel: TypeAlias = "ModelRef | Model | str | os.PathLike[str]"
ModelInput = Any  # RemoteModel | torch.nn.Module
DatasetInput = Any  # DatasetRef | Dataset | str | os.PathLike | torch Dataset | DataLoader


def is_live_module(model: Any) -> bool:
    """A ``torch.nn.Module`` instance (checked without importing torch ourselves)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


class Trainer:
    """Train a model on the ACE3 service or in this process.

    ``config``: a :class:`~ace3.TrainingConfig` (or a :class:`~ace3.DistributedConfig`, or a
    dict of its fields, or a DeepSpeed config dict: one with ``zero_optimization``,
    ``train_batch_size`` or ``train_micro_batch_size_per_gpu``, see
    :meth:`~ace3.TrainingConfig.from_deepspeed`). The keyword arguments follow the ACE3 document:

    - ``amp_config``: an :class:`~ace3.AMPConfig` (overrides the config's precision fields);
    - ``optimizer``: an optimizer built on your model (``ace3.training.optimizers.*``, or torch's
      AdamW/Adam/SGD); ``scheduler``: an ``ace3.training.schedulers.*`` schedule (its optimizer is used
      when ``optimizer`` is not given). The trainer builds its own optimizer and schedule from
      their class and hyperparameters, for the model it trains;
    - ``logger``: one logger or a list (``TrainingLogger``, ``TensorBoardLogger``,
      ``WandBLogger``); ``callbacks``: a list of ``ace3.Callback`` objects;
    - ``checkpoint_config``: a :class:`~ace3.CheckpointConfig` (``save_dir`` is local: remote
      checkpoints are copied there as the job stores them).
    """

    #: the parallelism this trainer runs; None accepts any value of the config
    parallelism: ClassVar[str | None] = None

    def __init__(
        self,
        config: TrainingConfig | DistributedConfig | Mapping[str, Any] | None = None,
        *,
        client: Client | None = None,
        amp_config: AMPConfig | None = None,
        optimizer: Any = None,
        scheduler: Any = None,
        logger: Any = None,
        callbacks: Sequence[Any] | None = None,
        checkpoint_config: CheckpointConfig | None = None,
    ):
        self.config = self._to_training_config(config)
        self._check_parallelism(self.config)
        if amp_config is not None and not isinstance(amp_config, AMPConfig):
            raise TypeError(
                f"amp_config must be an ace3.AMPConfig, not {type(amp_config).__name__}"
            )
        if checkpoint_config is not None and not isinstance(checkpoint_config, CheckpointConfig):
            raise TypeError(
                "checkpoint_config must be an ace3.CheckpointConfig, "
                f"not {type(checkpoint_config).__name__}"
            )
        self.client = client
        self.amp_config = amp_config
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loggers = _as_list(logger)
        self.callbacks = _as_list(callbacks)
        self.checkpoint_config = checkpoint_config
        self._check_callbacks_and_loggers()
        self.last_job: JobHandle | None = None
        self._resume_source: str | None = None  # a local checkpoint path or a checkpoint id
        self.config = self._with_objects(self.config)  # fail fast on what cannot be carried

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
            from ace3.config.deepspeed import is_deepspeed_config

            if is_deepspeed_config(config):  # e.g. {"zero_optimization": {"stage": 3}, ...}
                return TrainingConfig.from_deepspeed(config, **overrides)
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

    def _check_callbacks_and_loggers(self) -> None:
        from ace3.training.callbacks.base import Callback
        from ace3.training.loggers.base import Logger

        for index, callback in enumerate(self.callbacks):
            if not isinstance(callback, Callback):
                raise TypeError(
                    f"callbacks[{index}] must be an ace3.Callback (or a subclass), "
                    f"not {type(callback).__name__}"
                )
        for index, logger in enumerate(self.loggers):
            if not isinstance(logger, Logger):
                raise TypeError(
                    f"logger[{index}] must be an ace3 logger (TrainingLogger, TensorBoardLogger, "
                    f"WandBLogger), not {type(logger).__name__}"
                )

    def _with_objects(self, config: TrainingConfig) -> TrainingConfig:
        """``config`` with the fields the trainer's objects stand for."""
        fields: dict[str, Any] = {}
        if self.amp_config is not None:
            fields.update(self.amp_config.training_fields())
        if self.checkpoint_config is not None:
            fields.update(self.checkpoint_config.training_fields())
        optimizer = self.optimizer
        if optimizer is None and self.scheduler is not None:
            optimizer = getattr(self.scheduler, "optimizer", None)
        if optimizer is not None:
            from ace3.training.optimizers import optimizer_settings

            fields.update(optimizer_settings(optimizer))
        if self.scheduler is not None:
            from ace3.training.schedulers import scheduler_spec

            fields["lr_scheduler"] = scheduler_spec(self.scheduler)
        for logger in self.loggers:
            fields.update(logger.training_fields())
        if not fields:
            return config
        return TrainingConfig(**{**config.model_dump(), **fields})

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

    # -- checkpoints ------------------------------------------------------------------------

    def load_checkpoint(self, path_or_id: str | os.PathLike[str]) -> None:
        """Resume the next ``train(..., resume=True)`` from this checkpoint.

        A local file (checked to exist now; a remote job resumes from the stored checkpoint
        with the same sha256, e.g. one the SDK downloaded into a ``save_dir``), or the id of a
        checkpoint stored on the service (``result.checkpoints[-1].id``).
        """
        value = os.fspath(path_or_id)
        if not value:
            raise ValueError("load_checkpoint needs a checkpoint path or id")
        looks_like_path = os.sep in value or value.endswith((".pt", ".pth", ".tar", ".safetensors"))
        if looks_like_path and not Path(value).is_file():
            raise FileNotFoundError(f"checkpoint file not found: {value}")
        self._resume_source = value

    @property
    def resume_source(self) -> str | None:
        """What :meth:`load_checkpoint` was given (a local file or a stored checkpoint's id),
        or None: ``train(resume=True)`` then resumes from the newest file in ``save_dir``."""
        return self._resume_source

    # -- training -------------------------------------------------------------------------

    @overload
    def train(
        self,
        model: RemoteModel,
        dataset: DatasetInput = None,
        *,
        train_dataset: DatasetInput = None,
        validation_dataset: DatasetInput = None,
        epochs: int | None = None,
        model_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        priority: str | None = None,
        wait: Literal[True] = True,
        show_progress: bool | None = True,
        idempotency_key: str | None = None,
        resume: bool = False,
    ) -> TrainingResult: ...

    @overload
    def train(
        self,
        model: RemoteModel,
        dataset: DatasetInput = None,
        *,
        train_dataset: DatasetInput = None,
        validation_dataset: DatasetInput = None,
        epochs: int | None = None,
        model_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        priority: str | None = None,
        wait: Literal[False],
        show_progress: bool | None = True,
        idempotency_key: str | None = None,
        resume: bool = False,
    ) -> JobHandle: ...

    @overload
    def train(
        self,
        model: RemoteModel,
        dataset: DatasetInput = None,
        *,
        train_dataset: DatasetInput = None,
        validation_dataset: DatasetInput = None,
        epochs: int | None = None,
        model_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        priority: str | None = None,
        wait: bool,
        show_progress: bool | None = True,
        idempotency_key: str | None = None,
        resume: bool = False,
    ) -> TrainingResult | JobHandle: ...

    @overload
    def train(
        self,
        model: torch.nn.Module,
        dataset: DatasetInput = None,
        *,
        train_dataset: DatasetInput = None,
        validation_dataset: DatasetInput = None,
        epochs: int | None = None,
        resume: bool = False,
        compute_loss: Callable[..., Any] | None = None,
        compute_metrics: Callable[..., Any] | None = None,
    ) -> LocalTrainingResult: ...

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
        priority: str | None = None,
        wait: bool = True,
        show_progress: bool | None = True,
        idempotency_key: str | None = None,
        resume: bool = False,
        compute_loss: Callable[..., Any] | None = None,
        compute_metrics: Callable[..., Any] | None = None,
    ) -> TrainingResult | JobHandle | LocalTrainingResult:
        """Train ``model`` on ``dataset``; see the class docstring for where it runs.

        Remote: ``model`` from ``client.load_model`` (or a path, loaded here); datasets from
        ``client.load_dataset`` or paths. Returns a :class:`~ace3.TrainingResult` when the job
        succeeds; raises :class:`~ace3.errors.JobFailedError` (with its last log lines) or
        :class:`~ace3.errors.JobCancelledError`; Ctrl-C while waiting cancels the job.
        ``wait=False`` returns a :class:`~ace3.JobHandle` at once.

        In process: ``model`` a live ``nn.Module`` (trained in place), datasets a torch
        Dataset, a DataLoader, an ``(inputs, targets)`` tuple of tensors or a data file path;
        ``compute_loss(model, batch)`` / ``compute_metrics(model, batch)`` as in a model file.
        Returns an ``ace3.trainers.in_process.LocalTrainingResult``.

        ``resume=True`` continues from the checkpoint given to :meth:`load_checkpoint`, else
        from the newest checkpoint in ``checkpoint_config.save_dir``.

        ``priority`` (remote: ``"high"``, ``"normal"`` or ``"low"``) orders the job's claim in
        the service's queue.

        The overloads say what comes back: a remote model gives a ``TrainingResult`` (a
        ``JobHandle`` with ``wait=False``), a live module a ``LocalTrainingResult``.
        """
        if dataset is not None and train_dataset is not None:
            raise ValueError("pass the training data as dataset or train_dataset, not both")
        training_data = dataset if dataset is not None else train_dataset
        if model is None:
            raise ValueError(
                "model is required: pass client.load_model('model.py') or a torch.nn.Module"
            )
        if training_data is None:
            raise ValueError("a dataset is required: pass dataset= (or train_dataset=)")
        config = self.resolve_config(epochs)
        if is_live_module(model):
            from ace3.trainers.in_process import run_locally

            return run_locally(
                self._objects(), config, model, training_data, validation_dataset, resume,
                compute_loss, compute_metrics,
            )  # fmt: skip
        if compute_loss is not None or compute_metrics is not None:
            raise ValueError(
                "compute_loss/compute_metrics are for in-process runs; a remote job takes them "
                "from the model file (define compute_loss(model, batch) there)"
            )
        from ace3.trainers.remote import follow_job, submit_job

        objects = self._objects()
        handle, plan = submit_job(
            objects, config, model, training_data, validation_dataset,
            model_kwargs=model_kwargs, name=name, priority=priority,
            idempotency_key=idempotency_key or str(uuid.uuid4()), resume=resume,
        )  # fmt: skip
        self.last_job = handle
        if not wait:
            return handle
        return follow_job(objects, plan, handle, show_progress=show_progress)

    def _objects(self) -> TrainerObjects:
        """What a run reads of this trainer (it never sees the trainer itself)."""
        return TrainerObjects.of(
            client=self.client,
            callbacks=self.callbacks,
            loggers=self.loggers,
            checkpoint_config=self.checkpoint_config,
            resume_source=self._resume_source,
        )


_TRAINER_FOR = {
    "data": "DataParallelTrainer",
    "model": "ModelParallelTrainer",
    "pipeline": "PipelineParallelTrainer",
}
