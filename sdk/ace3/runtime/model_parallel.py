"""Model-parallel and pipeline-parallel jobs: build, step, validate and checkpoint.

``parallelism='pipeline'`` (and ``'model'`` with strategy ``'pipeline'`` or ``'layer'``) cuts the
model into one stage per process (:mod:`ace3.runtime.stage_split`) and runs
:mod:`ace3.runtime.pipeline`; ``'layer'`` is the same pipeline with one micro-batch (the
layers are placed on different ranks; no overlap). ``'model'`` with strategy ``'tensor'``
shards linear layers over all ranks (:mod:`ace3.runtime.tensor_parallel`) and uses the
ordinary step runner without DDP.

In both, every rank reads the same batches (one data-parallel replica): ``per_rank_batch`` is
``batch_size``. Checkpoints are the plain ``.pt`` format of a one-process data-parallel job
(``world_size`` 1): the full model state dict under the model's own parameter names and the
optimizer state keyed as an optimizer over all the model's parameters would key it, gathered
on rank 0. So a pipeline or tensor-parallel checkpoint resumes a one-process job and the other
way round, and resumes a model-parallel job on any number of processes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset

from ace3.config import TrainingConfig, pipeline_layout
from ace3.runtime.build import Components, apply_dropout_override, refuse_unsupported
from ace3.runtime.distributed import DistContext
from ace3.runtime.optim import build_optimizer, build_scheduler
from ace3.runtime.pipeline import PipelineRunner, broadcast_from_last, clip_global_norm
from ace3.runtime.precision import resolve_precision
from ace3.runtime.rng import capture_rng, rank_seed, restore_rng, seed_all
from ace3.runtime.stage_split import pipeline_stages
from ace3.runtime.step_counts import total_optimizer_steps
from ace3.runtime.train_state import TrainState
from ace3.runtime.user_code import UserCode


@dataclass
class ModelParallelRun:
    """How this job splits the model: ``kind`` is ``pipeline`` or ``tensor``."""

    kind: str
    full_model: nn.Module  # every rank builds the whole model; names come from it
    describe: str
    runner: PipelineRunner | None = None  # pipeline jobs
    stage_names: list[str] = field(default_factory=list)  # pipeline: each stage, for the log

    @property
    def is_pipeline(self) -> bool:
        return self.kind == "pipeline"


def is_model_parallel(parts: Components) -> bool:
    return getattr(parts, "model_parallel", None) is not None


def _stage_label(stage: nn.Module) -> str:
    names = [name for name, _ in stage.named_children()]
    count = sum(p.numel() for p in stage.parameters())
    span = f"layers {names[0]}-{names[-1]}" if len(names) > 1 else f"layer {names[0]}"
    return f"{span} ({count} parameters)" if names else f"{count} parameters"


def assemble_model_parallel(
    config: TrainingConfig,
    ctx: DistContext,
    user: UserCode,
    model: nn.Module,
    train_set: Dataset[Any],
    validation_set: Dataset[Any] | None,
    ckpt: dict[str, Any] | None,
    resume_label: str | None,
) -> Components:
    """Components of a model-parallel or pipeline job (see the module docstring)."""
    refuse_unsupported(config)
    apply_dropout_override(model, config, ctx)
    if ckpt is not None:
        _check_resumable(ckpt)
        model.load_state_dict(ckpt["model"])  # before any split: the names are the model's
    layout = pipeline_layout(config)
    precision = resolve_precision(config, ctx.device)
    if precision.needs_scaler:
        raise ValueError(
            f"float16 loss scaling is not implemented with parallelism={config.parallelism!r}; "
            "use amp_dtype='bfloat16' or mixed_precision=False"
        )
    if layout is not None:
        run, local = _pipeline(config, ctx, user, model, layout)
    else:
        from ace3.runtime.tensor_parallel import parallelize

        model.to(ctx.device)
        describe = parallelize(model, ctx, user.module)
        run, local = ModelParallelRun("tensor", model, describe), model
    precision.prepare_model(local)
    if ctx.is_main:
        print(run.describe, flush=True)
        for line in run.stage_names:
            print(line, flush=True)
    params = precision.optimizer_parameters(local)
    if not params:
        raise ValueError(
            f"rank {ctx.rank}'s part of the model has no trainable parameters: choose other "
            "split points (pipeline_split_points) or fewer processes"
        )
    optimizer = build_optimizer(params, config)
    # One data replica: every rank reads the same batches of batch_size samples.
    scheduler = build_scheduler(
        optimizer, config, total_optimizer_steps(config, train_set, 1, config.batch_size)
    )
    scaler = precision.make_scaler(config)
    seed_all(rank_seed(config.seed, ctx.rank))
    parts = Components(
        config=config, user=user, model=local, ddp=local, optimizer=optimizer, scaler=scaler,
        precision=precision, scheduler=scheduler, train_set=train_set,
        validation_set=validation_set, per_rank_batch=config.batch_size, state=TrainState(),
    )  # fmt: skip
    parts.model_parallel = run
    if ckpt is not None:
        parts.state = _restore(ckpt, parts, ctx)
        if ctx.is_main:
            print(
                f"resumed from {resume_label} at step {parts.state.step} "
                f"(epoch {parts.state.epoch + 1}, batch {parts.state.batch_in_epoch})"
            )
    return parts


def _pipeline(
    config: TrainingConfig,
    ctx: DistContext,
    user: UserCode,
    model: nn.Module,
    layout: tuple[int, int, str],
) -> tuple[ModelParallelRun, nn.Module]:
    stages_count, micro_batches, schedule = layout
    if ctx.world_size != stages_count:
        raise ValueError(
            f"this pipeline has {stages_count} stages and the job started {ctx.world_size} "
            f"processes: run one process per stage (num_gpus * num_nodes = {stages_count})"
        )
    for name in ("compute_loss", "compute_metrics"):
        if getattr(user, name) is not None:
            raise ValueError(
                f"{name} in the model file needs the whole model, which no pipeline rank "
                "holds: remove it (the last stage computes the default loss: cross-entropy "
                "for integer targets, mean squared error for float ones) or use "
                "parallelism='data' or model_sharding_strategy='tensor'"
            )
    stages = pipeline_stages(model, stages_count, config.pipeline_split_points, user.module)
    local = stages[ctx.rank].to(ctx.device)
    micro_size = config.batch_size // micro_batches
    runner = PipelineRunner(
        local, ctx.rank, stages_count, micro_batches, micro_size, schedule, ctx.device
    )
    what = (
        "model parallel (layer): consecutive layers on "
        f"{stages_count} process(es), one micro-batch per batch (a pipeline without overlap)"
        if config.model_sharding_strategy == "layer"
        else f"pipeline parallel: {stages_count} stage(s), {schedule} schedule, "
        f"{micro_batches} micro-batch(es) of {micro_size} per batch of {config.batch_size}"
    )
    labels = [f"stage {i} (rank {i}): {_stage_label(s)}" for i, s in enumerate(stages)]
    return ModelParallelRun("pipeline", model, what, runner, labels), local


# -- steps ----------------------------------------------------------------------------------------
class PipelineStepRunner:
    """One optimizer step of a pipeline job (the interface of ``steps.StepRunner``)."""

    def __init__(self, parts: Components, ctx: DistContext, config: TrainingConfig) -> None:
        self.parts, self.ctx, self.config = parts, ctx, config
        run = parts.model_parallel
        assert run is not None and run.runner is not None
        self.runner = run.runner
        self.split = 1  # no out-of-memory splitting: the stages' buffers have fixed shapes
        self.last_step_skipped = False

    def run(self, batches: list[Any], step: int) -> tuple[torch.Tensor, int]:
        """Run ``batches`` (accumulated) through the pipeline and step; return (the mean
        loss, the same on every rank; the samples)."""
        parts = self.parts
        parts.precision.zero_grad(parts.optimizer)
        loss, samples = 0.0, 0
        for batch in batches:
            with parts.precision.autocast():
                part, count = self.runner.train_batch(batch, 1.0 / len(batches))
            loss += part
            samples += count
        (loss,) = broadcast_from_last([loss], self.runner.num_stages, self.ctx.device)
        if self.config.max_grad_norm is not None:
            clip_global_norm(
                parts.precision.clip_parameters(parts.model), self.config.max_grad_norm
            )
        parts.optimizer.step()
        return torch.tensor(loss, dtype=torch.float32, device=self.ctx.device), samples


def evaluate_pipeline(parts: Components, loader: Any, ctx: DistContext) -> dict[str, float]:
    """``val_loss`` and ``val_accuracy`` through the pipeline (every rank reads the same
    batches; the last stage counts and broadcasts)."""
    run = parts.model_parallel
    assert run is not None and run.runner is not None
    runner = run.runner
    runner.reset_sums()
    parts.model.eval()
    try:
        for batch in loader:
            with parts.precision.autocast():
                runner.eval_batch(batch)
    finally:
        parts.model.train()
    loss_sum, samples, correct, not_classification = broadcast_from_last(
        runner.sums, runner.num_stages, ctx.device
    )
    if samples == 0:
        return {}
    metrics = {"val_loss": loss_sum / samples}
    if not_classification == 0:
        metrics["val_accuracy"] = correct / samples
    return metrics


# -- checkpoints --------------------------------------------------------------------------------
def _trainable_names(model: nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad]


def _full(value: Any) -> Any:
    """A plain CPU tensor (a DTensor's full value: a collective)."""
    if hasattr(value, "full_tensor"):
        value = value.full_tensor()
    return value.detach().cpu() if isinstance(value, torch.Tensor) else value


def _local_model_and_optimizer(parts: Components) -> tuple[dict[str, Any], dict[str, Any]]:
    """This rank's share: ``{name: tensor}`` of its parameters and buffers, and its optimizer
    state keyed by parameter name (full tensors; a collective for tensor parallel)."""
    run = parts.model_parallel
    assert run is not None
    full = run.full_model
    by_id = {id(t): name for name, t in full.named_parameters()}
    by_id.update({id(t): name for name, t in full.named_buffers()})
    local = parts.model
    tensors = list(local.parameters()) + list(local.buffers())
    model_state = {by_id[id(t)]: _full(t) for t in tensors if id(t) in by_id}
    opt_state: dict[str, Any] = {}
    if parts.config.save_optimizer:
        params = [p for group in parts.optimizer.param_groups for p in group["params"]]
        for param in params:
            state = parts.optimizer.state.get(param, {})
            opt_state[by_id[id(param)]] = {key: _full(value) for key, value in state.items()}
    return model_state, opt_state


def full_state(parts: Components, ctx: DistContext) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole model state dict and the optimizer state dict of a one-process job, on rank 0
    (empty dicts elsewhere). A collective."""
    run = parts.model_parallel
    assert run is not None
    model_state, opt_by_name = _local_model_and_optimizer(parts)
    if run.is_pipeline and ctx.world_size > 1:
        gathered: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
        dist.gather_object((model_state, opt_by_name), gathered, dst=0)
        if not ctx.is_main:
            return {}, {}
        assert gathered is not None
        model_state, opt_by_name = {}, {}
        for states, opts in gathered:
            model_state.update(states)
            opt_by_name.update(opts)
    elif not ctx.is_main:
        return {}, {}
    ordered = {key: model_state[key] for key in run.full_model.state_dict() if key in model_state}
    if not parts.config.save_optimizer:
        return ordered, {}
    names = _trainable_names(run.full_model)
    group = {k: v for k, v in parts.optimizer.state_dict()["param_groups"][0].items()}
    group["params"] = list(range(len(names)))
    state = {i: opt_by_name[name] for i, name in enumerate(names) if opt_by_name.get(name)}
    return ordered, {"state": state, "param_groups": [group]}


def checkpoint_payload(
    parts: Components, ctx: DistContext, rng_per_rank: list[Any] | None
) -> dict[str, Any] | None:
    """The plain checkpoint (``format`` 1, ``world_size`` 1) on rank 0; None elsewhere.
    A collective."""
    model_state, optimizer_state = full_state(parts, ctx)
    if not ctx.is_main:
        return None
    config = parts.config
    scheduler = parts.scheduler
    keep = config.save_scheduler
    return {
        "model": model_state,
        "optimizer": optimizer_state,
        "scaler": {},
        "scheduler": scheduler.state_dict() if keep and scheduler is not None else {},
        **parts.state.to_checkpoint(),
        "rng_per_rank": rng_per_rank,
        "world_size": 1,  # one data-parallel replica: every rank read the same batches
        "format": 1,
        "model_parallel": {"parallelism": config.parallelism, "processes": ctx.world_size},
    }


def _check_resumable(ckpt: dict[str, Any]) -> None:
    if "train_state" in ckpt or ckpt.get("format") == 2 or "model" not in ckpt:
        raise ValueError(
            "a sharded (.dcp.tar) checkpoint cannot resume a model-parallel or pipeline job: "
            "convert it with ace3.runtime.sharded_checkpoint.consolidate(path) and resume from "
            "the plain .pt file"
        )
    saved = int(ckpt.get("world_size") or 0)
    if saved != 1:
        raise ValueError(
            f"this checkpoint was written by a data-parallel job of {saved} processes; a "
            "model-parallel or pipeline job resumes checkpoints of one data-parallel replica "
            "(a one-process job, or another model-parallel job)"
        )


def _restore(ckpt: dict[str, Any], parts: Components, ctx: DistContext) -> TrainState:
    """Optimizer, scheduler, RNG and loop position (the weights were loaded before the split)."""
    run = parts.model_parallel
    assert run is not None
    saved = ckpt.get("optimizer") or {}
    if saved:
        names = _trainable_names(run.full_model)
        by_name = {names[i]: value for i, value in saved["state"].items()}
        full = {id(p): name for name, p in run.full_model.named_parameters()}
        params = [p for group in parts.optimizer.param_groups for p in group["params"]]
        local_state = {}
        for i, param in enumerate(params):
            state = by_name.get(full[id(param)])
            if state:
                local_state[i] = {k: _like(v, param) for k, v in state.items()}
        group = {**saved["param_groups"][0], "params": list(range(len(params)))}
        parts.optimizer.load_state_dict({"state": local_state, "param_groups": [group]})
    elif ctx.is_main:
        print("note: the checkpoint holds no optimizer state: the optimizer starts fresh")
    if parts.scheduler is not None and ckpt.get("scheduler"):
        parts.scheduler.load_state_dict(ckpt["scheduler"])
    rngs = ckpt.get("rng_per_rank") or []
    if len(rngs) == ctx.world_size:
        restore_rng(rngs[ctx.rank])
    elif ctx.is_main:
        print(
            f"note: the checkpoint holds the random state of {len(rngs)} process(es), this "
            f"job has {ctx.world_size}: dropout and other random draws start fresh"
        )
    return TrainState.from_checkpoint(ckpt)


def _like(value: Any, param: torch.Tensor) -> Any:
    """An optimizer state tensor placed like ``param`` (a DTensor shard for tensor parallel)."""
    if not isinstance(value, torch.Tensor) or value.shape != param.shape or value.ndim == 0:
        return value
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(
            value.to(param.device_mesh.device_type), param.device_mesh, param.placements
        )
    return value.to(param.device)


def rng_states(ctx: DistContext) -> list[Any] | None:
    """Every rank's RNG states on rank 0 (a collective)."""
    gathered: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
    if ctx.world_size > 1:
        dist.gather_object(capture_rng(), gathered, dst=0)
    elif gathered is not None:
        gathered[0] = capture_rng()
    return gathered
