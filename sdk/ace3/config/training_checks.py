"""What :class:`~ace3.config.training.TrainingConfig`'s own validators check, as functions of
the values they need: the global batch splits over the replicas, offload needs FSDP, and a
pipeline job without ``num_gpus`` runs one process per stage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OFFLOAD_WITH_STAGE_1 = (
    "{field}=True needs zero_stage 2 or 3 (FSDP offloads the sharded parameters, gradients and "
    "optimizer state to the CPU), or zero_stage=0, which then runs ZeRO-3 with offload; "
    "zero_stage=1 (ZeroRedundancyOptimizer) keeps its optimizer shard on the device: set "
    "zero_stage=2 or 3, or turn {field} off"
)


def pipeline_processes_default(data: Any) -> Any:
    """``parallelism='pipeline'`` with ``num_stages`` (or ``pipeline_parallel_size``) and no
    ``num_gpus`` runs one process per stage, times the tensor and data degrees given (the
    document's pipeline example gives only ``num_stages``)."""
    if not (
        isinstance(data, Mapping)
        and data.get("parallelism") == "pipeline"
        and data.get("num_gpus") is None
        and data.get("num_nodes", 1) == 1
    ):
        return data
    stages = data.get("pipeline_parallel_size") or data.get("num_stages")
    ways, replicas = data.get("tensor_parallel_size") or 1, data.get("data_parallel_size") or 1
    if isinstance(stages, int) and isinstance(ways, int) and isinstance(replicas, int):
        return {**data, "num_gpus": stages * ways * replicas}
    return data


def check_batch_split(batch_size: int, num_gpus: int, num_nodes: int, split: int = 1) -> None:
    """The global batch splits evenly over the data-parallel replicas (``split``: the ranks
    of one replica, pipeline x tensor degree; a layout that does not divide is refused
    elsewhere)."""
    world_size = num_gpus * num_nodes
    if split > 1:
        if world_size % split:
            return
        replicas = world_size // split
        if batch_size % replicas:
            raise ValueError(
                f"batch_size ({batch_size}) must be divisible by the {replicas} data-parallel "
                f"replicas (num_gpus * num_nodes = {world_size} over pipeline x tensor = "
                f"{split}): it is the global batch, split evenly"
            )
        return
    if batch_size % world_size:
        raise ValueError(
            f"batch_size ({batch_size}) must be divisible by the number of processes "
            f"num_gpus * num_nodes = {world_size}: it is the global batch, split evenly"
        )
