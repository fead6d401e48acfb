"""Scale and layout settings of :class:`~ace3.config.training.TrainingConfig`: processes,
nodes, the rendezvous of a local launch, and the data / pipeline / tensor / ZeRO layout. Kept
apart so that the training schema stays readable; ``TrainingConfig`` inherits
:class:`ScaleFields` (first, so that its validators see these values). Checks across the
layout: :mod:`ace3.config.layout` and :mod:`ace3.config.unsupported`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Parallelism = Literal["data", "model", "pipeline"]
ShardingStrategy = Literal["layer", "tensor", "pipeline"]
PipelineSchedule = Literal["gpipe", "1f1b"]
Backend = Literal["auto", "nccl", "gloo"]


class ScaleFields(BaseModel):
    """``num_gpus``, ``num_nodes``, ``backend``, the local rendezvous, ``parallelism`` and the
    pipeline, tensor, data-parallel and ZeRO settings."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    num_gpus: int = Field(
        1,
        ge=1,
        le=1024,
        description="Processes per node: one per GPU (or CPU slot on a CPU worker).",
    )
    num_nodes: int = Field(1, ge=1, le=1024, description="Machines (workers) that train together.")
    backend: Backend = Field(
        "auto",
        description="torch.distributed backend: auto = nccl on CUDA workers, gloo on CPU workers.",
    )
    node_rank: int | None = Field(
        None,
        ge=0,
        description="Local launches only: this machine's rank. The service assigns ranks itself.",
    )
    master_addr: str | None = Field(
        None,
        min_length=1,
        description="Local launches only: rendezvous host. The service assigns it itself.",
    )
    master_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Local launches only: rendezvous port. The service assigns it itself.",
    )
    parallelism: Parallelism = Field("data", description="How work is split across processes.")
    model_sharding_strategy: ShardingStrategy | None = Field(
        None, description="With parallelism='model': layer, tensor or pipeline."
    )
    num_stages: int | None = Field(
        None, ge=1, description="Pipeline stages (parallelism='pipeline')."
    )
    micro_batch_size: int | None = Field(
        None,
        ge=1,
        description="Pipeline micro-batch size: each batch_size batch runs as batch_size / "
        "micro_batch_size micro-batches (default: num_stages micro-batches).",
    )
    pipeline_schedule: PipelineSchedule = Field(
        "1f1b",
        description="Pipeline schedule (torch.distributed.pipelining): gpipe (all forwards, then "
        "all backwards) or 1f1b (one forward, one backward: fewer activations held).",
    )
    pipeline_split_points: list[int] | None = Field(
        None,
        description="Pipeline stages: indices of the nn.Sequential layers where stages 2..N "
        "start (num_stages - 1 increasing indices); default: balanced by parameter count.",
    )
    data_parallel_size: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Data-parallel degree D, if you want it checked: it is always what the "
        "processes leave, num_gpus * num_nodes / (pipeline_parallel_size * "
        "tensor_parallel_size); another value is refused.",
    )
    tensor_parallel_size: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Tensor-parallel degree T: linear layers sharded over T consecutive ranks; "
        "data parallelism over what remains: num_gpus * num_nodes = D x P x T.",
    )
    pipeline_parallel_size: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Pipeline degree P (num_stages is its alias): the model cut into P stages, "
        "one per rank of each pipeline; data parallelism over what remains.",
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(
        0,
        description="ZeRO sharding: 0 plain DDP; 1 optimizer state sharded (DDP + "
        "ZeroRedundancyOptimizer); 2 + gradients (FSDP, parameters kept gathered between forward "
        "and backward); 3 + parameters (FSDP, fully sharded). 0 with any offload runs stage 3.",
    )
