"""Training configuration schemas: the wire contract shared by the SDK, the API and the engine.

Defined once here as pydantic models; the server validates job requests with these same classes,
and the engine (``ace3.runtime``) reads them back from the job file. No torch import here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ace3.specs import CallbackSpec, ProfilerSpec, SchedulerSpec, TensorBoardSpec

AmpLevel = Literal["O0", "O1", "O2", "O3"]
Parallelism = Literal["data", "model", "pipeline"]
ShardingStrategy = Literal["layer", "tensor", "pipeline"]
PipelineSchedule = Literal["gpipe", "1f1b"]
Backend = Literal["auto", "nccl", "gloo"]
OptimizerName = Literal["adamw", "adam", "sgd", "memory_efficient_adam", "adam8bit"]
AmpDtype = Literal["auto", "float16", "bfloat16"]


class _Schema(BaseModel):
    """Strict base: unknown fields are an error (a typo must never be silently ignored)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TrainingConfig(_Schema):
    """Everything a training job needs to know besides its model and data.

    Batch sizes: ``batch_size`` is the *global* batch of one forward/backward micro-step, summed
    over every process (``num_gpus * num_nodes``); each data-parallel replica sees ``batch_size
    / replicas`` samples (a replica is one process, or with pipeline and tensor parallelism the
    ``pipeline_parallel_size * tensor_parallel_size`` processes that hold one copy of the
    model). With ``gradient_accumulation_steps = k`` one optimizer step consumes ``k *
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

    # -- optimisation ------------------------------------------------------------------------
    epochs: int = Field(3, ge=1, le=100_000, description="Passes over the training data.")
    max_steps: int | None = Field(
        None, ge=1, description="Stop after this many optimizer steps, even mid-epoch."
    )
    max_runtime_seconds: float | None = Field(
        None,
        gt=0,
        le=366 * 24 * 3600,
        description="Wall-clock seconds one attempt of a job may run; the worker then stops "
        "it (SIGTERM, then SIGKILL after the grace period) and the job fails, naming the limit. "
        "Jobs on the service only (an in-process run is refused: stop it yourself).",
    )
    batch_size: int = Field(
        32, ge=1, le=1_000_000, description="Global micro-batch, summed over all processes."
    )
    gradient_accumulation_steps: int = Field(
        1, ge=1, le=100_000, description="Micro-steps per optimizer step."
    )
    learning_rate: float = Field(1e-3, gt=0.0, le=10.0, description="Peak learning rate.")
    optimizer: OptimizerName = Field(
        "adamw", description="adamw, adam, sgd, memory_efficient_adam or adam8bit."
    )
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum.")
    betas: tuple[float, float] = Field(
        (0.9, 0.999), description="Adam-family moment decay rates (beta1, beta2), each in [0, 1)."
    )
    eps: float = Field(1e-8, gt=0.0, le=1.0, description="Adam-family denominator epsilon.")
    lr_scheduler: SchedulerSpec | None = Field(
        None, description="Learning-rate schedule (constant when None); see ace3.schedulers."
    )
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
        "dynamic",
        description="Loss scaling for float16: dynamic, static (init_loss_scale) or a fixed value.",
    )
    keep_batchnorm_fp32: bool | None = Field(
        None, description="O2/O3: keep BatchNorm in float32 (default: True for O2, False for O3)."
    )
    init_loss_scale: float = Field(2.0**16, gt=0.0, description="First loss scale.")
    loss_scale_growth_factor: float = Field(
        2.0, gt=1.0, description="Dynamic scaling: multiply the scale after a clean window."
    )
    loss_scale_backoff_factor: float = Field(
        0.5, gt=0.0, lt=1.0, description="Dynamic scaling: multiply the scale on overflow."
    )
    loss_scale_window: int = Field(
        2000, ge=1, description="Dynamic scaling: overflow-free steps before the scale grows."
    )
    min_loss_scale: float = Field(1.0, gt=0.0, description="Dynamic scaling: lower bound.")
    max_loss_scale: float = Field(2.0**24, gt=0.0, description="Dynamic scaling: upper bound.")

    # -- memory ------------------------------------------------------------------------------
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass."
    )
    checkpoint_segments: int | None = Field(
        None, ge=1, description="Segments for gradient checkpointing."
    )
    cpu_offload: bool = Field(
        False,
        description="Keep the sharded parameters, gradients and optimizer state in CPU memory "
        "(FSDP CPUOffloadPolicy; the optimizer steps on the CPU). Needs zero_stage 2 or 3; with "
        "zero_stage=0 the job runs ZeRO-3. No effect on a CPU device.",
    )
    offload_optimizer: bool = Field(
        False,
        description="Offload the optimizer state to CPU memory: FSDP keeps it next to the sharded "
        "parameters, so this offloads them too (the same as cpu_offload).",
    )
    offload_parameters: bool = Field(
        False,
        description="Offload the sharded parameters (and gradients) to CPU memory (the same as "
        "cpu_offload).",
    )
    dynamic_batch_size: bool = Field(
        True,
        description="On out-of-memory, halve the micro-batch and double the accumulation (the "
        "effective batch is unchanged) and retry the step.",
    )
    find_unused_parameters: bool | None = Field(
        None,
        description="DDP's find_unused_parameters. None: learnt at step 1 (a model that left some "
        "parameter without a gradient gets it); True: for models whose forward pass skips "
        "different parameters from batch to batch (mixtures of experts, layer drop); False: "
        "never (plain DDP).",
    )

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
    save_optimizer: bool = Field(
        True, description="Checkpoints hold the optimizer state (needed for an exact resume)."
    )
    save_scheduler: bool = Field(
        True, description="Checkpoints hold the scheduler and loss-scaler state."
    )

    # -- callbacks, logging, profiling ---------------------------------------------------------
    callbacks: list[CallbackSpec] = Field(
        default_factory=list, description="Callbacks run by the engine on every rank."
    )
    tensorboard: TensorBoardSpec | None = Field(
        None, description="Write TensorBoard event files (rank 0)."
    )
    profiler: ProfilerSpec | None = Field(None, description="Profile rank 0 with torch.profiler.")

    @property
    def world_size(self) -> int:
        return self.num_gpus * self.num_nodes

    @property
    def offload(self) -> bool:
        """Any of ``cpu_offload``, ``offload_optimizer``, ``offload_parameters``."""
        return self.cpu_offload or self.offload_optimizer or self.offload_parameters

    @property
    def effective_zero_stage(self) -> int:
        """The ZeRO stage the engine runs: ``zero_stage``, or 3 when it is 0 and offload is on
        (offloading needs sharded state)."""
        return 3 if self.zero_stage == 0 and self.offload else self.zero_stage

    @classmethod
    def from_deepspeed(cls, ds_config: Mapping[str, Any], **fields: Any) -> TrainingConfig:
        """A config from a DeepSpeed configuration dict (``zero_optimization.stage``,
        ``fp16.enabled``, ``optimizer.type``, ...); ``fields`` set what such a dict does not
        hold (``num_gpus``, ``epochs``, ...). Every key that cannot be honoured exactly is
        refused with :class:`~ace3.errors.UnsupportedFeatureError`, naming its path; see
        :mod:`ace3.deepspeed_config` for the mapping."""
        from ace3.deepspeed_config import training_config_from_deepspeed

        return training_config_from_deepspeed(ds_config, **fields)

    @model_validator(mode="before")
    @classmethod
    def _pipeline_processes_default_to_stages(cls, data: Any) -> Any:
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
        if all(isinstance(value, int) for value in (stages, ways, replicas)):
            return {**data, "num_gpus": stages * ways * replicas}
        return data

    # Field validators (not a model validator) so that a refused assignment keeps the old value
    # and the error names the field; each sees the other fields already set.
    @field_validator("batch_size")
    @classmethod
    def _batch_splits_across_processes(cls, batch_size: int, info: ValidationInfo) -> int:
        if info.data.get("parallelism", "data") == "data":  # model parallel: checked at run
            nodes = info.data.get("num_nodes", 1)
            split = (info.data.get("tensor_parallel_size") or 1) * (
                info.data.get("pipeline_parallel_size") or 1
            )
            _check_batch_split(batch_size, info.data.get("num_gpus", 1), nodes, split)
        return batch_size

    @field_validator("betas")
    @classmethod
    def _betas_in_unit_interval(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"betas {betas} must both be in [0, 1)")
        return betas

    @field_validator("cpu_offload", "offload_optimizer", "offload_parameters")
    @classmethod
    def _offload_needs_fsdp(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("zero_stage") == 1:
            raise ValueError(_OFFLOAD_WITH_STAGE_1.format(field=info.field_name))
        return value

    @field_validator("zero_stage")
    @classmethod
    def _stage_1_cannot_offload(cls, stage: int, info: ValidationInfo) -> int:
        # At construction the offload fields come later and check themselves; this catches an
        # assignment of zero_stage=1 to a config that already offloads.
        offloading = [name for name in _OFFLOAD_FIELDS if info.data.get(name)]
        if stage == 1 and offloading:
            raise ValueError(_OFFLOAD_WITH_STAGE_1.format(field=offloading[0]))
        return stage

    @field_validator("num_gpus", "num_nodes")
    @classmethod
    def _processes_split_the_batch(cls, value: int, info: ValidationInfo) -> int:
        # An assignment (at construction batch_size checks itself); data parallel only.
        if "batch_size" in info.data and info.data.get("parallelism", "data") == "data":
            other = info.data["num_nodes" if info.field_name == "num_gpus" else "num_gpus"]
            split = (info.data.get("tensor_parallel_size") or 1) * (
                info.data.get("pipeline_parallel_size") or 1
            )
            _check_batch_split(info.data["batch_size"], value, other, split)
        return value


_OFFLOAD_FIELDS = ("cpu_offload", "offload_optimizer", "offload_parameters")
_OFFLOAD_WITH_STAGE_1 = (
    "{field}=True needs zero_stage 2 or 3 (FSDP offloads the sharded parameters, gradients and "
    "optimizer state to the CPU), or zero_stage=0, which then runs ZeRO-3 with offload; "
    "zero_stage=1 (ZeroRedundancyOptimizer) keeps its optimizer shard on the device: set "
    "zero_stage=2 or 3, or turn {field} off"
)


def _check_batch_split(batch_size: int, num_gpus: int, num_nodes: int, split: int = 1) -> None:
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


class AMPConfig(_Schema):
    """The document's manual mixed-precision settings; ``ace3.Trainer(amp_config=...)`` applies
    them over the config's precision fields.

    Levels: O0 float32; O1 autocast (float32 weights, per-op 16-bit); O2 16-bit weights with a
    float32 master copy in the optimizer (BatchNorm kept float32 unless
    ``keep_batchnorm_fp32=False``); O3 everything 16-bit, no master copy. Loss scaling applies to
    float16 only (bfloat16 has float32's range).
    """

    enabled: bool = True
    opt_level: AmpLevel = "O1"
    dtype: AmpDtype = "auto"
    keep_batchnorm_fp32: bool | None = None
    loss_scale: Literal["dynamic", "static"] | float = "dynamic"
    init_scale: float = Field(2.0**16, gt=0.0)
    min_loss_scale: float = Field(1.0, gt=0.0)
    max_loss_scale: float = Field(2.0**24, gt=0.0)

    def training_fields(self) -> dict[str, Any]:
        """The :class:`TrainingConfig` fields these settings stand for: ``enabled`` and
        ``opt_level`` always, the others only when given (else the config's values stay)."""
        names = {
            "dtype": "amp_dtype",
            "keep_batchnorm_fp32": "keep_batchnorm_fp32",
            "loss_scale": "loss_scaling",
            "init_scale": "init_loss_scale",
            "min_loss_scale": "min_loss_scale",
            "max_loss_scale": "max_loss_scale",
        }
        fields = {"mixed_precision": self.enabled, "amp_level": self.opt_level}
        fields.update({names[k]: getattr(self, k) for k in names if k in self.model_fields_set})
        return fields


class CheckpointConfig(_Schema):
    """Where and how often checkpoints are written; ``ace3.Trainer(checkpoint_config=...)``.

    ``save_dir`` is a local directory: local runs write there; for remote jobs the SDK copies
    each checkpoint there as soon as the service has stored it. ``max_checkpoints`` keeps the
    newest N (never deleting the only verified one).
    """

    save_dir: str | None = None
    save_interval: int | None = Field(None, ge=1)
    max_checkpoints: int | None = Field(None, ge=1)
    save_optimizer: bool = True
    save_scheduler: bool = True

    def training_fields(self) -> dict[str, Any]:
        """The fields given here (one left out keeps the training config's value)."""
        fields = ("save_interval", "max_checkpoints", "save_optimizer", "save_scheduler")
        return {name: getattr(self, name) for name in fields if name in self.model_fields_set}


class ConfigProblem(BaseModel):
    """One reason a config cannot run: the field and what to do about it."""

    field: str
    reason: str


# Settings the engine does not implement yet: the values it accepts, and why others are refused.
_NOT_YET: dict[str, tuple[tuple[Any, ...], str]] = {}


# Optimizers whose update math does not run on FSDP's sharded (DTensor) parameters yet.
_PLAIN_TENSOR_OPTIMIZERS = ("memory_efficient_adam", "adam8bit")


def unsupported_settings(config: TrainingConfig) -> list[ConfigProblem]:
    """Settings the engine would have to ignore: refused instead, each with its reason."""
    problems = []
    for field, (accepted, reason) in _NOT_YET.items():
        value = getattr(config, field)
        if value not in accepted:
            problems.append(ConfigProblem(field=field, reason=f"{field}={value!r}: {reason}"))
    return problems + _unsupported_with_zero(config) + _model_parallel_problems(config)


def _unsupported_with_zero(config: TrainingConfig) -> list[ConfigProblem]:
    """Combinations with ZeRO sharding that this version does not implement."""
    stage = config.effective_zero_stage
    if stage == 0:
        return []
    implied = stage != config.zero_stage
    how = "offload (which runs ZeRO-3)" if implied else f"zero_stage={stage}"
    plain = "turn offload off" if implied else "zero_stage=0"
    problems = []
    split = runs_pipeline(config) or runs_tensor_parallel(config)  # checked with the layout
    if config.num_nodes > 1 and not split:
        problems.append(
            ConfigProblem(
                field="num_nodes",
                reason=f"num_nodes={config.num_nodes} with {how}: sharded checkpoints are "
                "written by every rank and packed on rank 0, which needs one filesystem across "
                "the nodes; multi-node ZeRO is not implemented yet: use data parallelism "
                "across nodes, or " + plain,
            )
        )
    if config.mixed_precision and config.amp_level in ("O2", "O3"):
        problems.append(
            ConfigProblem(
                field="amp_level",
                reason=f"amp_level={config.amp_level!r} with {how}: 16-bit weights with ZeRO "
                "sharding are not implemented yet (O2's float32 master copies and O3's 16-bit "
                "parameters are not sharded); use amp_level='O1' (autocast), or " + plain,
            )
        )
    if stage >= 2 and config.optimizer in _PLAIN_TENSOR_OPTIMIZERS and not split:
        problems.append(
            ConfigProblem(
                field="optimizer",
                reason=f"optimizer={config.optimizer!r} with {how}: its update on FSDP's sharded "
                "parameters is not implemented yet; use adamw, adam or sgd"
                + ("" if implied else ", or zero_stage=1"),
            )
        )
    board = config.tensorboard
    if stage >= 2 and board is not None and (board.log_graph or board.log_histograms):
        asked = [name for name in ("log_graph", "log_histograms") if getattr(board, name)]
        problems.append(
            ConfigProblem(
                field="tensorboard",
                reason=f"tensorboard {' and '.join(asked)} with {how}: not implemented yet (rank "
                "0 would trace or read the sharded parameters alone, which takes every rank); "
                "turn them off"
                + (" or turn offload off" if implied else " or use zero_stage 0 or 1"),
            )
        )
    return problems


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


def _model_parallel_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """Settings that do not fit the layout chosen: data, pipeline and tensor degrees."""
    problems: list[ConfigProblem] = []

    def refuse(field: str, reason: str) -> None:
        problems.append(ConfigProblem(field=field, reason=f"{field}: {reason}"))

    mode, strategy = config.parallelism, config.model_sharding_strategy
    pipelined, tensored = runs_pipeline(config), runs_tensor_parallel(config)
    pipeline_fields = ("num_stages", "micro_batch_size", "pipeline_split_points")
    if mode == "data":
        legacy = ("model_sharding_strategy", "num_stages")
        for name in legacy if pipelined else (*legacy, *pipeline_fields[1:]):
            if getattr(config, name) is not None:
                refuse(name, f"only used with parallelism='model' or 'pipeline'"
                       f"{'' if name in legacy else ' or pipeline_parallel_size > 1'}; got "
                       f"{getattr(config, name)!r} with parallelism='data': remove it")  # fmt: skip
    if mode == "model" and strategy is None:
        refuse("model_sharding_strategy", "parallelism='model' needs one of 'layer', 'tensor', "
               "'pipeline' (e.g. model_sharding_strategy='layer')")  # fmt: skip
        return problems
    if mode == "pipeline" and strategy not in (None, "pipeline"):
        refuse("model_sharding_strategy", f"{strategy!r} is for parallelism='model'; "
               "parallelism='pipeline' needs none")  # fmt: skip
    stages_alias, pp_size = config.num_stages, config.pipeline_parallel_size
    if stages_alias is not None and pp_size is not None and stages_alias != pp_size:
        refuse("pipeline_parallel_size", f"{pp_size} differs from num_stages={stages_alias}, "
               "its alias: set one of them")  # fmt: skip
    world = config.world_size
    stages, ways = parallel_degrees(config, world)
    wanted = config.data_parallel_size
    if wanted is not None and (world % (stages * ways) or wanted != world // (stages * ways)):
        refuse("data_parallel_size", f"{wanted} is not what the layout leaves: num_gpus * "
               f"num_nodes = {world} over pipeline {stages} x tensor {ways} is "
               f"{world / (stages * ways):g} data-parallel replica(s); set num_gpus * num_nodes "
               f"= {wanted * stages * ways}, or leave data_parallel_size out")  # fmt: skip
    if not (pipelined or tensored):
        return problems
    if world % (stages * ways):
        field = "tensor_parallel_size" if config.tensor_parallel_size else (
            "pipeline_parallel_size" if pp_size else "num_stages")  # fmt: skip
        refuse(field, f"pipeline ({stages}) x tensor ({ways}) must divide the {world} processes "
               "(num_gpus * num_nodes): one process per stage and tensor shard, data "
               "parallelism over what remains")  # fmt: skip
        return problems
    replicas = world // (stages * ways)
    if config.batch_size % replicas:
        refuse("batch_size", f"{config.batch_size} must be divisible by the {replicas} "
               "data-parallel replicas: it is the global batch, split evenly")  # fmt: skip
    what = "pipeline" if pipelined else "tensor"
    what = "pipeline and tensor" if pipelined and tensored else what
    if config.offload:
        asked = next(name for name in _OFFLOAD_FIELDS if getattr(config, name))
        refuse(asked, f"offload with {what} parallelism is not implemented (the "
               "gathered checkpoints and the clipping norm would cross devices): turn it "
               "off; zero_stage=2 or 3 shards the state over the replicas")  # fmt: skip
    elif config.effective_zero_stage and replicas == 1:
        refuse("zero_stage", f"ZeRO shards the state over data-parallel replicas, and this "
               f"{what}-parallel layout has one ({world} processes = pipeline {stages} x "
               f"tensor {ways}): use zero_stage=0 and no offload, or more processes")  # fmt: skip
    elif config.zero_stage == 1:
        refuse("zero_stage", f"ZeRO-1 with {what} parallelism is not implemented: use "
               "zero_stage=2 or 3 (FSDP over the data-parallel replicas) or 0 (gradients "
               "averaged over the replicas, DDP-style)")  # fmt: skip
    if config.mixed_precision and config.amp_level in ("O2", "O3"):
        refuse("amp_level", f"{config.amp_level!r} with {what} parallelism is not implemented: "
               "use amp_level='O1' (autocast) or mixed_precision=False")  # fmt: skip
    if config.gradient_checkpointing:
        refuse("gradient_checkpointing", f"not implemented with {what} parallelism: turn it "
               "off")  # fmt: skip
    board = config.tensorboard
    if board is not None and (board.log_graph or board.log_histograms):
        refuse("tensorboard", f"log_graph and log_histograms are not implemented with {what} "
               "parallelism (each rank holds part of the model): turn them off")  # fmt: skip
    if (tensored or config.effective_zero_stage >= 2) and config.optimizer in (
        _PLAIN_TENSOR_OPTIMIZERS
    ):
        refuse("optimizer", f"{config.optimizer!r} on sharded (DTensor) parameters is not "
               "implemented: use adamw, adam or sgd")  # fmt: skip
    if config.mixed_precision and config.amp_dtype == "float16":
        refuse("amp_dtype", f"float16 loss scaling with {what} parallelism is not implemented "
               "(the scaler would have to agree across ranks that hold different parts): use "
               "amp_dtype='bfloat16'")  # fmt: skip
    if not pipelined:
        for name in pipeline_fields if mode != "data" else ():  # (data mode: refused above)
            if getattr(config, name) is not None:
                refuse(name, "a pipeline setting; tensor parallelism alone does not use it: "
                       "remove it")  # fmt: skip
        return problems
    layout = pipeline_layout(config)
    assert layout is not None
    _, micro_batches, schedule = layout
    if strategy == "layer":
        for name in ("micro_batch_size", "num_stages"):
            if getattr(config, name) is not None:
                refuse(name, "model_sharding_strategy='layer' runs one micro-batch on one stage "
                       "per process: remove it, or use model_sharding_strategy='pipeline'")  # fmt: skip
    batch = config.batch_size // replicas
    micro = config.micro_batch_size or batch // stages
    if strategy != "layer" and (micro < 1 or batch % micro):
        field = "micro_batch_size" if config.micro_batch_size else "batch_size"
        share = f" (each of the {replicas} replicas' {batch})" if replicas > 1 else ""
        refuse(field, f"batch_size ({config.batch_size}){share} must be a multiple of the "
               f"micro-batch ({micro if micro >= 1 else 'batch_size / num_stages'}): set "
               "micro_batch_size to a divisor of it")  # fmt: skip
    elif schedule == "1f1b" and micro_batches < stages:
        refuse("micro_batch_size", f"the 1f1b schedule needs at least one micro-batch per stage: "
               f"a batch of {batch} / micro_batch_size {micro} = {micro_batches} < "
               f"{stages} stages; use a smaller micro_batch_size or pipeline_schedule='gpipe'")  # fmt: skip
    points = config.pipeline_split_points
    if points is not None and (
        len(points) != stages - 1 or any(b <= a for a, b in zip([0, *points], points, strict=False))
    ):
        refuse("pipeline_split_points", f"{points} must be {stages - 1} increasing layer indices "
               "above 0 (where stages 2.. start)")  # fmt: skip
    return problems
