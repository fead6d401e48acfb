"""The parallel layout of a job: which dimensions it runs (pipeline, tensor) and their degrees
over the processes; the data-parallel degree is what the two leave."""

from __future__ import annotations

from ace3.config.training import TrainingConfig


def runs_pipeline(config: TrainingConfig) -> bool:
    """The job cuts the model into pipeline stages: ``parallelism='pipeline'``, ``'model'``
    with strategy ``layer`` or ``pipeline``, or ``pipeline_parallel_size`` above 1."""
    return (
        config.parallelism == "pipeline"
        or (config.parallelism == "model" and config.model_sharding_strategy in _PIPELINED)
        or (config.pipeline_parallel_size or 1) > 1
    )


def runs_tensor_parallel(config: TrainingConfig) -> bool:
    """The job shards linear layers: ``parallelism='model'`` with strategy ``tensor``, or
    ``tensor_parallel_size`` above 1."""
    return (config.parallelism == "model" and config.model_sharding_strategy == "tensor") or (
        config.tensor_parallel_size or 1
    ) > 1


_PIPELINED = ("layer", "pipeline")


def parallel_degrees(config: TrainingConfig, world_size: int | None = None) -> tuple[int, int]:
    """(pipeline, tensor) degrees of a job on ``world_size`` processes (default: the config's
    ``num_gpus * num_nodes``); the data-parallel degree is what remains, ``world_size /
    (pipeline * tensor)``. The shorthands take every process: ``model_sharding_strategy=
    'tensor'`` without ``tensor_parallel_size`` shards over all of them (what the pipeline
    leaves), a pipeline without ``num_stages`` / ``pipeline_parallel_size`` has one stage per
    process."""
    world = config.world_size if world_size is None else world_size
    pp = config.pipeline_parallel_size or config.num_stages or 1
    tp = config.tensor_parallel_size or 1
    shorthand_tensor = config.parallelism == "model" and config.model_sharding_strategy == "tensor"
    if shorthand_tensor and config.tensor_parallel_size is None:
        tp = max(world // pp, 1)
    if runs_pipeline(config) and not (config.pipeline_parallel_size or config.num_stages):
        pp = max(world // tp, 1)
    return pp, tp


def pipeline_layout(
    config: TrainingConfig, world_size: int | None = None
) -> tuple[int, int, str] | None:
    """(stages, micro-batches per batch, schedule) for a job that runs a pipeline (see
    :func:`runs_pipeline`); None otherwise. ``layer`` is a pipeline with one micro-batch
    (GPipe: no overlap). The batch is a data-parallel replica's share of ``batch_size``."""
    if not runs_pipeline(config):
        return None
    world = config.world_size if world_size is None else world_size
    stages, tp = parallel_degrees(config, world)
    replicas = max(world // (stages * tp), 1)
    batch = max(config.batch_size // replicas, 1)
    if config.model_sharding_strategy == "layer":
        return stages, 1, "gpipe"
    micro = config.micro_batch_size or max(batch // stages, 1)
    return stages, max(batch // micro, 1), config.pipeline_schedule
