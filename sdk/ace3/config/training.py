"""Training configuration schemas: the wire contract shared by the SDK, the API and the engine.

Defined once here as pydantic models; the server validates job requests with these same classes,
and the engine (``ace3.runtime``) reads them back from the job file. No torch import here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ace3.config.base import OFFLOAD_FIELDS, _Schema
from ace3.config.batch_growth import DynamicBatchSizeConfig, batch_size_from_growth
from ace3.config.checkpointing import CheckpointFields
from ace3.config.communication import CommunicationFields
from ace3.config.compression import CompressionFields
from ace3.config.distillation import DistillationFields
from ace3.config.environment import EnvironmentFields
from ace3.config.eval_samples import EvalSampleFields
from ace3.config.extra_optimizers import ExtraOptimizerFields
from ace3.config.fine_tuning import FineTuningFields
from ace3.config.instability import InstabilityFields
from ace3.config.lora import LoRAFields
from ace3.config.optimizer_choice import OptimizerKwargs, OptimizerName
from ace3.config.precision import AmpDtype as AmpDtype
from ace3.config.precision import AmpLevel as AmpLevel
from ace3.config.precision import PrecisionFields
from ace3.config.preemption import PreemptionFields
from ace3.config.scale import Backend as Backend
from ace3.config.scale import Parallelism as Parallelism
from ace3.config.scale import PipelineSchedule as PipelineSchedule
from ace3.config.scale import ScaleFields
from ace3.config.scale import ShardingStrategy as ShardingStrategy
from ace3.config.specs import CallbackSpec, ProfilerSpec, SchedulerSpec, TensorBoardSpec
from ace3.config.speed import SpeedFields
from ace3.config.training_checks import (
    OFFLOAD_WITH_STAGE_1,
    check_batch_split,
    pipeline_processes_default,
)


class TrainingConfig(
    EnvironmentFields,
    LoRAFields,
    FineTuningFields,
    CompressionFields,
    DistillationFields,
    CheckpointFields,
    EvalSampleFields,
    InstabilityFields,
    PreemptionFields,
    SpeedFields,
    CommunicationFields,
    ExtraOptimizerFields,
    PrecisionFields,
    ScaleFields,
    _Schema,
):
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

    # -- optimisation ------------------------------------------------------------------------
    epochs: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="Passes over the training data. Default (None): 3 (epoch_count); on a "
        "streamed (sharded) dataset with max_steps set, as many as max_steps needs: the stream "
        "cycles.",
    )
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
    learning_rate: float = Field(
        1e-3, gt=0.0, allow_inf_nan=False, description="Peak learning rate (any finite > 0)."
    )
    optimizer: OptimizerName = Field(
        "adamw",
        description="adamw, adam, sgd, memory_efficient_adam, adam8bit; lion, sophia, "
        "galore_adamw (pip install 'ace3[optimizers]') or adafactor (torch.optim.Adafactor); "
        "or any torch.optim class by its case-sensitive name ('Adadelta', 'SGD', 'RMSprop', "
        "...), built with lr=learning_rate, weight_decay and optimizer_kwargs.",
    )
    optimizer_kwargs: OptimizerKwargs = Field(
        default_factory=dict,
        description="A torch.optim class-name optimizer's other arguments (e.g. {'rho': 0.95} "
        "for 'Adadelta'); torch's defaults for the rest. Not for ACE3's own names.",
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
    dynamic_batch_size: bool | DynamicBatchSizeConfig = Field(
        True,
        description="True: on out-of-memory, halve the micro-batch and double the accumulation "
        "(the effective batch is unchanged) and retry the step. A DynamicBatchSizeConfig also "
        "grows the effective batch from initial_batch_size to target_batch_size while training "
        "is stable and shrinks it on out-of-memory or instability. False: neither.",
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
    shuffle: bool = Field(
        True,
        description="Shuffle the training samples each epoch (by seed and epoch). False: every "
        "epoch reads them in dataset order, replica r taking samples r, r + R, r + 2R, ... "
        "(R data-parallel replicas), e.g. for an RNN that carries its hidden state across batches.",
    )
    shuffle_buffer: int = Field(
        1000,
        ge=0,
        le=1_000_000,
        description="Streamed (sharded) datasets: samples each reader holds to shuffle within, "
        "besides shuffling the shard order per epoch (0 or 1: shard order only). Ignored for "
        "files and directories, which shuffle all samples.",
    )
    sequence_length: int | None = Field(
        None,
        ge=1,
        le=1 << 20,
        description="Tokens per sample of a 'tokens' dataset (windows of sequence_length + 1 "
        "token ids, stride sequence_length; labels shifted by one; required for one), or the "
        "most tokens of a tokenized text example (longer ones are truncated; for a Hugging "
        "Face model the default is its max_position_embeddings, at most 2048).",
    )
    packing: bool = Field(
        False,
        description="Text records (chat, prompt/completion, text) for a Hugging Face model: "
        "pack examples into sequences of sequence_length tokens (position ids restart per "
        "example) instead of padding each one.",
    )
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

    @property
    def epoch_count(self) -> int:
        """The passes over the data a job plans: ``epochs``, or 3 when it is unset."""
        return 3 if self.epochs is None else self.epochs

    @classmethod
    def from_deepspeed(cls, ds_config: Mapping[str, Any], **fields: Any) -> TrainingConfig:
        """A config from a DeepSpeed configuration dict (``zero_optimization.stage``,
        ``fp16.enabled``, ``optimizer.type``, ...); ``fields`` set what such a dict does not
        hold (``num_gpus``, ``epochs``, ...). Every key that cannot be honoured exactly is
        refused with :class:`~ace3.errors.UnsupportedFeatureError`, naming its path; see
        :mod:`ace3.config.deepspeed` for the mapping."""
        from ace3.config.deepspeed import training_fields_from_deepspeed

        return cls(**training_fields_from_deepspeed(ds_config, **fields))

    @model_validator(mode="before")
    @classmethod
    def _pipeline_processes_default_to_stages(cls, data: Any) -> Any:
        """``parallelism='pipeline'`` with ``num_stages`` (or ``pipeline_parallel_size``) and no
        ``num_gpus`` runs one process per stage, times the tensor and data degrees given (the
        document's pipeline example gives only ``num_stages``)."""
        return pipeline_processes_default(data)

    @model_validator(mode="before")
    @classmethod
    def _batch_size_defaults_to_growth_minimum(cls, data: Any) -> Any:
        """With batch-size growth and no ``batch_size``, the loader's batch is the growth's
        ``min_batch_size`` (:mod:`ace3.config.batch_growth`)."""
        return batch_size_from_growth(data)

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
            check_batch_split(batch_size, info.data.get("num_gpus", 1), nodes, split)
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
            raise ValueError(OFFLOAD_WITH_STAGE_1.format(field=info.field_name))
        return value

    @field_validator("zero_stage")
    @classmethod
    def _stage_1_cannot_offload(cls, stage: int, info: ValidationInfo) -> int:
        # At construction the offload fields come later and check themselves; this catches an
        # assignment of zero_stage=1 to a config that already offloads.
        offloading = [name for name in OFFLOAD_FIELDS if info.data.get(name)]
        if stage == 1 and offloading:
            raise ValueError(OFFLOAD_WITH_STAGE_1.format(field=offloading[0]))
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
            check_batch_split(info.data["batch_size"], value, other, split)
        return value
