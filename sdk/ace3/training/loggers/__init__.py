"""Loggers: where a run's metrics go besides the service (files, TensorBoard, W&B, MLflow).

A logger is a client-side object; the same object serves an in-process run and a remote job::

    logger = ace3.TrainingLogger(log_dir="./logs", log_interval=100)
    trainer = ace3.Trainer(logger=logger)          # or logger=[logger, tensorboard, ...]

Every logger implements :class:`Logger`; the SDK trainer uses it like this:

1. ``training_fields()`` -> the :class:`~ace3.TrainingConfig` fields it sets
   (``log_interval``, ``save_interval``, ``tensorboard``), merged into the job's config.
2. In-process runs: ``engine_hooks(local=True)`` -> engine hooks to add to the run (one that
   hands every metrics event to :meth:`Logger.log_metrics`). Remote jobs: nothing runs in the
   job on the logger's behalf except what its training fields ask for.
3. Remote jobs: ``artifact_dirs()`` -> ``{artifact prefix: local directory}``: files the job
   writes under ``artifact://<prefix>/`` are copied there while it runs (TensorBoard event
   files); ``checkpoint_dir()`` -> where the job's checkpoints are copied (None: nowhere).
4. ``start(info)`` once before training (``info``: ``job_id`` (None in process), ``config``
   (the job's config as a JSON dict), ``where`` (``"local"`` or ``"remote"``));
   ``log_metrics(step, epoch, values)`` for every metrics event (in process: from the engine;
   remote: the SDK, on this machine, as the job's metrics arrive); ``finish(status)`` once at
   the end (``"succeeded"``, ``"failed"`` or ``"cancelled"``).

The package: :mod:`.base` (``Logger``, the errors), :mod:`.arguments`, and one module per
logger (:mod:`.training_logger`, :mod:`.tensorboard_logger`, :mod:`.wandb_logger`,
:mod:`.mlflow_logger`).

No torch import here: the engine-side pieces live in :mod:`ace3.runtime.observe.logger_hooks` and
:mod:`ace3.runtime.observe.tensorboard_hook`.
"""

from ace3.training.loggers.base import Logger, LoggerArgumentError, LoggerUnavailableError
from ace3.training.loggers.mlflow_logger import MLFLOW_INSTALL_HINT as MLFLOW_INSTALL_HINT
from ace3.training.loggers.mlflow_logger import MLflowLogger
from ace3.training.loggers.tensorboard_logger import TensorBoardLogger
from ace3.training.loggers.training_logger import TrainingLogger
from ace3.training.loggers.wandb_logger import WANDB_INSTALL_HINT as WANDB_INSTALL_HINT
from ace3.training.loggers.wandb_logger import WandBLogger
from ace3.training.loggers.wandb_logger import wandb_configuration as wandb_configuration

__all__ = [
    "Logger",
    "LoggerArgumentError",
    "LoggerUnavailableError",
    "MLflowLogger",
    "TensorBoardLogger",
    "TrainingLogger",
    "WandBLogger",
]
