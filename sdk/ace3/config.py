"""Training configuration schemas: the wire contract shared by the SDK, the API and the engine.

Defined once here as pydantic models; the server validates job requests with these same classes,
and the engine (``ace3.runtime``) reads them back from the job file. No torch import here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

AmpLevel = Literal["O0", "O1", "O2", "O3"]
Parallelism = Literal["data", "model", "pipeline"]
ShardingStrategy = Literal["layer", "tensor", "pipeline"]
Backend = Literal["auto", "nccl", "gloo"]
OptimizerName = Literal["adamw", "adam", "sgd"]
AmpDtype = Literal["auto", "float16", "bfloat16"]


class _Schema(BaseModel):
    """Strict base: unknown fields are an error (a typo must never be silently ignored)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TrainingConfig(_Schema):
    """Everything a training job needs to know besides its model and data.

    Batch sizes: ``batch_size`` is the *global* batch of one forward/backward micro-step, summed
    over every process (``num_gpus * num_nodes``); each process sees ``batch_size / world_size``
    samples. With ``gradient_accumulation_steps = k`` one optimizer step consumes ``k *
    batch_size`` samples. On one process this matches the document's accumulation example
    (32 per device x 8 steps = 256); on several it matches its data-parallel example
    (256 across all GPUs).
    """

    # -- scale -------------------------------------------------------------------------------
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
    micro_batch_size: int | None = Field(None, ge=1, description="Pipeline micro-batch size.")
    zero_stage: Literal[0, 1, 2, 3] = Field(
        0, description="ZeRO sharding stage (0 = plain data parallel)."
    )

    # -- optimisation ------------------------------------------------------------------------
    epochs: int = Field(3, ge=1, le=100_000, description="Passes over the training data.")
    max_steps: int | None = Field(
        None, ge=1, description="Stop after this many optimizer steps, even mid-epoch."
    )
    batch_size: int = Field(
        32, ge=1, le=1_000_000, description="Global micro-batch, summed over all processes."
    )
    gradient_accumulation_steps: int = Field(
        1, ge=1, le=100_000, description="Micro-steps per optimizer step."
    )
    learning_rate: float = Field(1e-3, gt=0.0, le=10.0, description="Peak learning rate.")
    optimizer: OptimizerName = Field("adamw", description="adamw, adam or sgd.")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum.")
    weight_decay: float = Field(
        0.0, ge=0.0, le=1.0, description="Decoupled (AdamW) or L2 (Adam, SGD) weight decay."
    )
    max_grad_norm: float | None = Field(
        None, gt=0.0, description="Clip the global gradient norm (unscaled) to this value."
    )
    dropout: float | None = Field(
        None, ge=0.0, lt=1.0, description="Override p of every nn.Dropout in the model."
    )

    # -- precision ---------------------------------------------------------------------------
    mixed_precision: bool = Field(False, description="Autocast forward passes to a 16-bit type.")
    amp_dtype: AmpDtype = Field(
        "auto", description="auto = bfloat16 where supported (CPU, Ampere+), else float16."
    )
    amp_level: AmpLevel = Field("O1", description="O0 fp32, O1 autocast; O2/O3 cast weights too.")
    loss_scaling: Literal["dynamic", "static"] | float = Field(
        "dynamic", description="Loss scaling for float16."
    )

    # -- memory ------------------------------------------------------------------------------
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass."
    )
    checkpoint_segments: int | None = Field(
        None, ge=1, description="Segments for gradient checkpointing."
    )
    cpu_offload: bool = Field(False, description="Offload sharded state to CPU memory.")
    offload_optimizer: bool = Field(False, description="Offload optimizer state to CPU memory.")
    offload_parameters: bool = Field(False, description="Offload parameters to CPU memory.")

    # -- data, evaluation, checkpoints -------------------------------------------------------
    validation_split: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="Hold out this fraction of the training data for validation when no validation "
        "dataset is given. Default (None): 0.1, unless a dataset.py provides a 'validation' split; "
        "0 turns validation off.",
    )
    num_workers: int = Field(0, ge=0, le=64, description="DataLoader worker processes per rank.")
    seed: int = Field(
        42,
        ge=0,
        le=2**32 - 1,
        description="Seeds model init, shuffling and dropout: same seed, same run.",
    )
    log_interval: int = Field(
        10, ge=1, description="Optimizer steps between training-metric reports."
    )
    save_interval: int | None = Field(
        None,
        ge=1,
        description="Optimizer steps between checkpoints (a final one is always written).",
    )
    max_checkpoints: int | None = Field(
        None, ge=1, description="Keep only the newest N checkpoints."
    )

    @property
    def world_size(self) -> int:
        return self.num_gpus * self.num_nodes

    # Field validators (not a model validator) so that a refused assignment keeps the old value
    # and the error names the field; each sees the other fields already set.
    @field_validator("batch_size")
    @classmethod
    def _batch_splits_across_processes(cls, batch_size: int, info: ValidationInfo) -> int:
        _check_batch_split(batch_size, info.data.get("num_gpus", 1), info.data.get("num_nodes", 1))
        return batch_size

    @field_validator("num_gpus", "num_nodes")
    @classmethod
    def _processes_split_the_batch(cls, value: int, info: ValidationInfo) -> int:
        if "batch_size" in info.data:  # an assignment; at construction batch_size checks itself
            other = info.data["num_nodes" if info.field_name == "num_gpus" else "num_gpus"]
            _check_batch_split(info.data["batch_size"], value, other)
        return value


def _check_batch_split(batch_size: int, num_gpus: int, num_nodes: int) -> None:
    world_size = num_gpus * num_nodes
    if batch_size % world_size:
        raise ValueError(
            f"batch_size ({batch_size}) must be divisible by the number of processes "
            f"num_gpus * num_nodes = {world_size}: it is the global batch, split evenly"
        )


class DistributedConfig(_Schema):
    """The document's distributed settings; converted to a :class:`TrainingConfig` for a job."""

    num_gpus: int = Field(1, ge=1, le=1024)
    num_nodes: int = Field(1, ge=1, le=1024)
    backend: Backend = "auto"
    node_rank: int | None = Field(None, ge=0)
    master_addr: str | None = Field(None, min_length=1)
    master_port: int | None = Field(None, ge=1, le=65535)

    def to_training_config(self, **overrides: Any) -> TrainingConfig:
        return TrainingConfig(**{**self.model_dump(), **overrides})


class ConfigProblem(BaseModel):
    """One reason a config cannot run: the field and what to do about it."""

    field: str
    reason: str


# Settings the engine does not implement yet: the values it accepts, and why others are refused.
_NOT_YET: dict[str, tuple[tuple[Any, ...], str]] = {
    "parallelism": (("data",), "only parallelism='data' (DDP) runs in this version"),
    "model_sharding_strategy": ((None,), "model parallelism is not implemented yet"),
    "num_stages": ((None,), "pipeline parallelism is not implemented yet"),
    "micro_batch_size": ((None,), "pipeline micro-batches are not implemented yet"),
    "zero_stage": ((0,), "ZeRO / FSDP sharding is not implemented yet"),
    "amp_level": (("O0", "O1"), "only O0 (fp32) and O1 (autocast) are implemented yet"),
    "loss_scaling": (("dynamic",), "only dynamic loss scaling is implemented yet"),
    "gradient_checkpointing": ((False,), "gradient checkpointing is not implemented yet"),
    "checkpoint_segments": ((None,), "gradient checkpointing is not implemented yet"),
    "cpu_offload": ((False,), "CPU offload is not implemented yet"),
    "offload_optimizer": ((False,), "optimizer offload is not implemented yet"),
    "offload_parameters": ((False,), "parameter offload is not implemented yet"),
    "num_nodes": ((1,), "multi-node jobs are not implemented yet: use num_nodes=1"),
}


def unsupported_settings(config: TrainingConfig) -> list[ConfigProblem]:
    """Settings the engine would have to ignore: refused instead, each with its reason."""
    problems = []
    for field, (accepted, reason) in _NOT_YET.items():
        value = getattr(config, field)
        if value not in accepted:
            problems.append(ConfigProblem(field=field, reason=f"{field}={value!r}: {reason}"))
    return problems
