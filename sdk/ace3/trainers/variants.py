"""The parallel variants of :class:`~ace3.Trainer`: each fixes ``parallelism`` (and says what
it means); everything else is the trainer's."""

from __future__ import annotations

from ace3.trainers.trainer import Trainer

__all__ = [
    "DataParallelTrainer",
    "DistributedTrainer",
    "ModelParallelTrainer",
    "PipelineParallelTrainer",
]


class DistributedTrainer(Trainer):
    """Train across several processes (``num_gpus`` per node); any parallelism value."""


class DataParallelTrainer(Trainer):
    """Data parallel (DDP): every process holds the model and sees a slice of each batch."""

    parallelism = "data"


class ModelParallelTrainer(Trainer):
    """Model parallel (``parallelism='model'``): the model is split across the job's processes.

    ``model_sharding_strategy``: ``'layer'`` (consecutive layers on different processes, one
    micro-batch: a pipeline without overlap), ``'pipeline'`` (the same with micro-batches and
    a schedule, as :class:`PipelineParallelTrainer`) or ``'tensor'`` (linear layers sharded
    over all processes with torch's tensor-parallel APIs: an automatic plan for Linear pairs,
    or ``tensor_parallel_plan(model)`` from the model file). Every process reads the same
    batches. See docs/parallelism.md."""

    parallelism = "model"


class PipelineParallelTrainer(Trainer):
    """Pipeline parallel (``parallelism='pipeline'``): one stage of the model per process
    (``num_stages``; ``num_gpus`` defaults to it), each batch cut into micro-batches of
    ``micro_batch_size``, run on the ``pipeline_schedule`` (``'1f1b'`` or ``'gpipe'``) of
    ``torch.distributed.pipelining``. The model must be an ``nn.Sequential`` (split balanced by
    parameter count, or at ``pipeline_split_points``) or its file must define
    ``pipeline_stages(model, num_stages)``. See docs/parallelism.md."""

    parallelism = "pipeline"
