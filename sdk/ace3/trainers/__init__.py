"""The user entry points: :class:`Trainer` and its parallel variants (remote jobs or in-process
runs of a live module), and :func:`hyperparameter_search`. :mod:`.remote` follows a job on the
service, :mod:`.in_process` runs the engine here; :mod:`.downloads` copies a job's checkpoints
and artifacts to a local directory while it runs."""

from ace3.trainers.trainer import Trainer, is_live_module
from ace3.trainers.variants import (
    DataParallelTrainer,
    DistributedTrainer,
    ModelParallelTrainer,
    PipelineParallelTrainer,
)

__all__ = [
    "DataParallelTrainer",
    "DistributedTrainer",
    "ModelParallelTrainer",
    "PipelineParallelTrainer",
    "Trainer",
    "is_live_module",
]
