"""What each section of a :class:`~ace3.config.training.TrainingConfig` cannot run with,
given the rest of the config (LoRA, batch-size growth, the instability guard, preemption,
the speed settings, the extra optimizers), each as :class:`~ace3.config.problem.ConfigProblem`
with its reason, for :func:`ace3.config.unsupported.unsupported_settings`. Kept apart from the
section modules, which ``training.py`` imports for their fields, so that no section imports
the training config back."""

from __future__ import annotations

from ace3.config.batch_growth import batch_growth
from ace3.config.extra_optimizers import EXTRA_OPTIMIZERS, FIELD_OWNERS
from ace3.config.layout import parallel_degrees, runs_pipeline, runs_tensor_parallel
from ace3.config.problem import ConfigProblem
from ace3.config.speed import TORCH_IMPL_OPTIMIZERS
from ace3.config.training import TrainingConfig


def lora_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """What a job with ``lora`` cannot run with, each with its reason (for
    :func:`ace3.config.unsupported.unsupported_settings`)."""

    if config.lora is None:
        return []
    problems: list[ConfigProblem] = []

    def refuse(field: str, reason: str) -> None:
        problems.append(ConfigProblem(field=field, reason=f"{field} with lora: {reason}"))

    if config.freeze:
        refuse("freeze", "LoRA already freezes every base weight, so freeze has nothing to "
               "add: remove it (trainable=[...] names base parameters that train fully next "
               "to the adapters)")  # fmt: skip
    if runs_pipeline(config):
        refuse("pipeline_parallel_size", "not implemented: the pipeline splits the model by "
               "its layers before the adapters would be placed; use data parallelism "
               "(any zero_stage, 0 to 3)")  # fmt: skip
    if runs_tensor_parallel(config):
        refuse("tensor_parallel_size", "not implemented: the tensor plans shard nn.Linear "
               "layers that LoRA replaces; use data parallelism (any zero_stage, 0 to 3)")  # fmt: skip
    if config.pruning is not None:
        refuse("pruning", "not implemented: pruning would mask the frozen base weights and the "
               "adapter matrices alike, and the merged model would lose the masks; prune the "
               "merged model in a job of its own (init_from its merged_model.safetensors)")  # fmt: skip
    if config.quantization is not None:
        refuse("quantization", "not implemented: the int8 model would be made from the adapted "
               "layers, not the merged ones; quantize the merged model in a job of its own "
               "(init_from its merged_model.safetensors)")  # fmt: skip
    return problems


def batch_growth_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """What batch-size growth cannot run with, each with its reason (for
    :func:`ace3.config.unsupported.unsupported_settings`)."""

    growth = batch_growth(config)
    if growth is None:
        return []
    problems: list[ConfigProblem] = []

    def refuse(field: str, reason: str) -> None:
        problems.append(ConfigProblem(field=field, reason=f"{field}: {reason}"))

    if runs_pipeline(config):
        refuse("dynamic_batch_size", "batch-size growth with pipeline parallelism is not "
               "implemented: the pipeline's micro-batches have a fixed size; use "
               "dynamic_batch_size=True (or a fixed batch_size)")  # fmt: skip
    if config.gradient_accumulation_steps != 1:
        refuse("gradient_accumulation_steps", f"{config.gradient_accumulation_steps} with "
               "batch-size growth: the growth sets how many loader batches a step takes "
               "(target_batch_size / min_batch_size at most); leave it at 1")  # fmt: skip
    if config.batch_size != growth.min_batch_size:
        refuse("batch_size", f"{config.batch_size} with batch-size growth: the loader's batch "
               f"is min_batch_size ({growth.min_batch_size}); leave batch_size out (or give "
               "the same value, and a DataLoader of that batch size in-process)")  # fmt: skip
    processes = max(1, config.world_size)
    stages, ways = parallel_degrees(config, processes)
    replicas = max(1, processes // max(1, stages * ways))
    if growth.min_batch_size % replicas:
        refuse("dynamic_batch_size.min_batch_size", f"{growth.min_batch_size} must be divisible "
               f"by the {replicas} data-parallel replicas: every size is a global batch, split "
               "evenly")  # fmt: skip
    return problems


def instability_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """What ``instability`` cannot run with, each with its reason (for
    :func:`ace3.config.unsupported.unsupported_settings`)."""

    guard = config.instability
    if guard is None or guard.action != "rollback":
        return []
    problems: list[ConfigProblem] = []
    if runs_pipeline(config) or runs_tensor_parallel(config) or config.effective_zero_stage:
        problems.append(ConfigProblem(field="instability", reason=(
            "instability.action='rollback' is implemented for plain data parallelism "
            "(zero_stage=0, no pipeline or tensor parallelism, no offload) only: reloading a "
            "sharded or split checkpoint in the middle of a run is not; use action='skip' or "
            "'stop' with this layout"
        )))  # fmt: skip
    if config.num_nodes > 1:
        problems.append(ConfigProblem(field="instability", reason=(
            "instability.action='rollback' on more than one node is not implemented: every "
            "rank reloads the checkpoint file rank 0 wrote, which only its own node holds; use "
            "action='skip' or 'stop'"
        )))  # fmt: skip
    if config.save_interval is None:
        problems.append(ConfigProblem(field="instability", reason=(
            "instability.action='rollback' needs checkpoints to roll back to: set "
            "save_interval (optimizer steps between checkpoints)"
        )))  # fmt: skip
    return problems


def preemption_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """What the preemption settings cannot run with, each with its reason (for
    :func:`ace3.config.unsupported.unsupported_settings`)."""

    field = "preemption_grace_seconds"
    if config.preemption_grace_seconds is None:
        return []
    if not config.checkpoint_on_sigterm:
        return [ConfigProblem(field=field, reason=(
            f"{field} with checkpoint_on_sigterm=False: there is nothing to give a grace period "
            "to (SIGTERM ends the processes at once); remove one of them"
        ))]  # fmt: skip
    if config.num_nodes > 1:
        return [ConfigProblem(field=field, reason=(
            f"{field} with num_nodes > 1 is not implemented: a draining worker lets a "
            "multi-node attempt run to its end instead of preempting it (its ranks still "
            "checkpoint on a SIGTERM from outside); remove it"
        ))]  # fmt: skip
    return []


def speed_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """What the speed settings cannot run with, each with its reason (for
    :func:`ace3.config.unsupported.unsupported_settings`)."""

    problems: list[ConfigProblem] = []

    def refuse(field: str, reason: str) -> None:
        problems.append(ConfigProblem(field=field, reason=f"{field}: {reason}"))

    if not config.compile:
        for name, default in (("compile_mode", "default"), ("compile_fullgraph", False)):
            if getattr(config, name) != default:
                refuse(name, "only used with compile=True: set compile=True or remove it")
    else:
        if runs_pipeline(config):
            refuse("compile", "not implemented with pipeline parallelism (the stages are "
                   "built and run by torch.distributed.pipelining); use data parallelism or "
                   "ZeRO")  # fmt: skip
        elif runs_tensor_parallel(config):
            refuse("compile", "not implemented with tensor parallelism (the sharded layers' "
                   "DTensor redistributions are not traced); use data parallelism or ZeRO")  # fmt: skip
        if config.optimizer == "sophia":
            refuse("compile", "optimizer='sophia' needs the gradient's own graph "
                   "(create_graph=True) for its Hessian estimate, and compiled graphs do not "
                   "support double backward: use compile=False")  # fmt: skip
        if config.quantization is not None:
            refuse("compile", "not implemented with quantization (the int8 model is made from "
                   "a copy of the trained module, whose compiled forward belongs to the "
                   "original): quantize without compile")  # fmt: skip
        if config.pruning is not None:
            refuse("compile", "not implemented with pruning (its masks re-parametrize the "
                   "weights through forward hooks that change during training): prune "
                   "without compile")  # fmt: skip
    if config.optimizer_impl != "auto" and config.optimizer not in TORCH_IMPL_OPTIMIZERS:
        refuse("optimizer_impl", f"{config.optimizer_impl!r} chooses the kernels of torch's "
               f"Adam, AdamW and SGD; optimizer={config.optimizer!r} has its own: use "
               "optimizer_impl='auto'")  # fmt: skip
    return problems


def extra_optimizer_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """Optimizer-specific settings given for another optimizer, and the layouts the new
    optimizers do not run with, each with its reason."""

    problems: list[ConfigProblem] = []

    def refuse(field: str, reason: str) -> None:
        problems.append(ConfigProblem(field=field, reason=f"{field}: {reason}"))

    name = config.optimizer
    for field, owner in FIELD_OWNERS.items():
        if getattr(config, field) is not None and owner != name:
            refuse(field, f"a setting of optimizer={owner!r}, but optimizer={name!r}: remove "
                   f"it or set optimizer={owner!r}")  # fmt: skip
    if name in ("lion", "sophia", "adafactor") and tuple(config.betas) != (0.9, 0.999):
        own = "lion_betas" if name == "lion" else "sophia_betas"
        refuse("betas", f"the Adam family's; optimizer={name!r} does not use them"
               + ("" if name == "adafactor" else f": set {own}"))  # fmt: skip
    if name not in EXTRA_OPTIMIZERS:
        return problems
    if runs_pipeline(config) or runs_tensor_parallel(config):
        refuse("optimizer", f"{name!r} with pipeline or tensor parallelism is not implemented: "
               "use data parallelism (zero_stage 0)")  # fmt: skip
    elif config.effective_zero_stage >= 1:
        refuse("optimizer", f"{name!r} with ZeRO-{config.effective_zero_stage} is not "
               "implemented (its state is not sharded by ZeroRedundancyOptimizer or FSDP here): "
               "use zero_stage=0 and no offload")  # fmt: skip
    if name == "sophia":
        if config.world_size > 1:
            refuse("optimizer", "'sophia' runs on one process: its Hutchinson Hessian estimate "
                   "differentiates the gradient's own graph (create_graph=True), which DDP's "
                   "all-reduce does not keep; use num_gpus=1 and num_nodes=1")  # fmt: skip
        if config.mixed_precision:
            refuse("mixed_precision", "not implemented with optimizer='sophia' (the Hessian "
                   "estimate would differentiate the scaled 16-bit gradients): turn it off")  # fmt: skip
        if config.max_grad_norm is not None:
            refuse("max_grad_norm", "optimizer='sophia' clips its own update per coordinate "
                   "(sophia_rho); clipping the gradient in place would break the graph its "
                   "Hessian estimate needs: remove max_grad_norm")  # fmt: skip
        if config.distillation is not None:
            refuse("distillation", "not implemented with optimizer='sophia': use another "
                   "optimizer")  # fmt: skip
    if name == "galore_adamw" and config.lora is not None:
        refuse("lora", "GaLore and LoRA are two ways to train with low-rank updates: use one")
    return problems
