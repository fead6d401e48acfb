"""Settings a job cannot run with, refused up front with the field and the reason (the API
answers them as 422s, the SDK raises them before anything is uploaded)."""

from __future__ import annotations

from typing import Any

from ace3.config.base import OFFLOAD_FIELDS
from ace3.config.communication import communication_problems
from ace3.config.distillation_checks import distillation_problems
from ace3.config.layout import (
    parallel_degrees,
    pipeline_layout,
    runs_pipeline,
    runs_tensor_parallel,
)
from ace3.config.optimizer_choice import class_optimizer_problems
from ace3.config.problem import ConfigProblem
from ace3.config.section_checks import (
    batch_growth_problems,
    extra_optimizer_problems,
    instability_problems,
    lora_problems,
    preemption_problems,
    speed_problems,
)
from ace3.config.training import TrainingConfig

__all__ = ["ConfigProblem", "unsupported_settings"]


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
    return (
        problems
        + _unsupported_with_zero(config)
        + _model_parallel_problems(config)
        + _compression_problems(config)
        + lora_problems(config)
        + batch_growth_problems(config)
        + instability_problems(config)
        + preemption_problems(config)
        + speed_problems(config)
        + extra_optimizer_problems(config)
        + _eval_sample_problems(config)
        + [
            ConfigProblem(field=field, reason=f"{field}: {reason}")
            for field, reason in (
                *distillation_problems(config),
                *class_optimizer_problems(config),
                *communication_problems(
                    config, runs_pipeline(config) or runs_tensor_parallel(config)
                ),
            )
        ]
    )


def _eval_sample_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """``eval_prompts`` generates with the whole model on every rank: not with its layers split
    between pipeline stages or its tensors between processes."""
    if not config.eval_prompts or not (runs_pipeline(config) or runs_tensor_parallel(config)):
        return []
    return [ConfigProblem(field="eval_prompts", reason=(
        "eval_prompts with pipeline or tensor parallelism is not implemented: generation runs "
        "the whole model on every rank; use data parallelism or ZeRO (zero_stage 1 to 3)"
    ))]  # fmt: skip


def _compression_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """``pruning`` and ``quantization`` need the whole model on every rank (data parallelism,
    ZeRO 0 or 1) and float32 weights under their own names."""
    problems: list[ConfigProblem] = []
    asked = [name for name in ("pruning", "quantization") if getattr(config, name) is not None]
    for name in asked:
        what = (
            "pruning computes its magnitude masks over whole weight tensors"
            if name == "pruning"
            else "quantization converts the whole trained model"
        )
        if runs_pipeline(config) or runs_tensor_parallel(config):
            problems.append(ConfigProblem(field=name, reason=(
                f"{name} with pipeline or tensor parallelism is not implemented: {what}, and "
                "each rank holds part of the model; use data parallelism (zero_stage 0 or 1)"
            )))  # fmt: skip
        elif config.effective_zero_stage >= 2:
            problems.append(ConfigProblem(field=name, reason=(
                f"{name} with ZeRO-{config.effective_zero_stage} (FSDP) is not implemented: "
                f"{what}, and FSDP shards every parameter over the ranks; use zero_stage 0 or "
                "1 (and no offload)"
            )))  # fmt: skip
        if config.mixed_precision and config.amp_level in ("O2", "O3"):
            problems.append(ConfigProblem(field=name, reason=(
                f"{name} with amp_level={config.amp_level!r} is not implemented: the 16-bit "
                "weights (and O2's float32 master copies, kept by parameter name) would not "
                "follow the masks or the float32 model; use amp_level='O1' (autocast)"
            )))  # fmt: skip
    return problems


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
    if config.num_nodes > 1 and not split and config.async_save:
        # (synchronous saves send other nodes' shards to rank 0 over the process group)
        problems.append(
            ConfigProblem(
                field="async_save",
                reason=f"async_save with num_nodes={config.num_nodes} and {how}: background "
                "sharded checkpoints are packed on rank 0 from one filesystem, which the nodes "
                "do not share; multi-node ZeRO with async_save is not implemented yet: use "
                "async_save=False, or " + plain,
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
        asked = next(name for name in OFFLOAD_FIELDS if getattr(config, name))
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
