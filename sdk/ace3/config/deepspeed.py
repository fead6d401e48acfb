"""DeepSpeed-style configuration dicts, mapped onto :class:`~ace3.TrainingConfig`.

``ace3.TrainingConfig.from_deepspeed(ds_config, **fields)`` (and ``ace3.Trainer(config=...)``
with such a dict) reads the keys of a DeepSpeed JSON config and sets the ACE3 fields that do
the same thing. Every key whose behaviour ACE3 cannot reproduce exactly is refused, all of
them at once, with :class:`~ace3.errors.UnsupportedFeatureError`: each problem names the key's
path (``zero_optimization.overlap_comm``) and why. A key whose value is what ACE3 does anyway
(``fp16.auto_cast: false``) is accepted. A malformed value (a string where a number belongs,
inconsistent batch sizes) is a ``ValueError`` naming the key.

Keys absent from the dict keep ACE3's defaults, except under ``fp16``, where DeepSpeed's own
defaults apply (``loss_scale_window`` 1000). ``fields`` set what a DeepSpeed dict does not hold
(``num_gpus``, ``num_nodes``, ``epochs``, ...); a field the dict sets too is an error.

The mapping (see docs/parallelism.md for the full table):

- ``train_batch_size`` / ``train_micro_batch_size_per_gpu`` / ``gradient_accumulation_steps``
  -> ``batch_size`` (micro-batch per GPU x processes) and ``gradient_accumulation_steps``
  (DeepSpeed's rule: train = micro x accumulation x processes);
- ``gradient_clipping`` -> ``max_grad_norm`` (0: none); ``steps_per_print`` -> ``log_interval``;
- ``fp16.enabled`` / ``bf16.enabled`` -> ``mixed_precision`` O1 with float16 / bfloat16,
  ``fp16.loss_scale`` (0 = dynamic) -> ``loss_scaling``, ``fp16.initial_scale_power`` ->
  ``init_loss_scale = 2**p``, ``fp16.loss_scale_window``, ``fp16.min_loss_scale``;
  ``amp.enabled`` / ``amp.opt_level`` (apex) -> ``mixed_precision`` float16 at that level;
- ``zero_optimization.stage`` -> ``zero_stage``; ``offload_optimizer.device`` /
  ``offload_param.device`` ``"cpu"`` -> ``offload_optimizer`` / ``offload_parameters``;
- ``optimizer.type`` Adam (``adam_w_mode`` true, DeepSpeed's default), AdamW -> ``adamw``;
  Adam with ``adam_w_mode: false`` -> ``adam``; SGD -> ``sgd``; ``optimizer.params`` lr,
  betas, eps, weight_decay, momentum -> the same fields;
- ``communication_data_type`` -> the same field (fp16/bf16 gradient reduction);
  ``reduce_scatter_base_size`` (elements of float32 gradients) -> ``ddp_bucket_cap_mb``
  (refused at ZeRO-2/3: FSDP has no bucket to size); ``allgather_base_size``: accepted at
  ZeRO-0 (nothing is all-gathered), refused at 1-3 (nothing there has a bucket size);
- ``scheduler``: refused (DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR take their
  peak from ``warmup_max_lr`` and warm up from ``warmup_min_lr``, logarithmically by default:
  no ACE3 schedule gives the same learning rate at every step); pass ``lr_scheduler=``.

The section readers are :mod:`ace3.config.deepspeed_sections`; this module is the entry point
(recognising a DeepSpeed dict, the top-level keys, refusing all problems at once). No torch
import here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ace3.config.deepspeed_sections import (
    DeepSpeedMapping,
    read_flag,
    read_number,
    read_section,
)
from ace3.config.problem import ConfigProblem
from ace3.errors import UnsupportedFeatureError

__all__ = ["is_deepspeed_config", "training_fields_from_deepspeed"]


# Keys only a DeepSpeed dict has (none is a TrainingConfig field): how a dict is recognised.
DEEPSPEED_MARKERS = (
    "zero_optimization",
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "allgather_base_size",
    "reduce_scatter_base_size",
)

_SCHEDULER_REASON = (
    "DeepSpeed's {kind} does not give the same learning rate at every step as any ACE3 "
    "schedule (its peak is warmup_max_lr, not the optimizer's lr, and it warms up from "
    "warmup_min_lr, logarithmically by default): leave 'scheduler' out and pass "
    "lr_scheduler= (ace3.schedulers, e.g. warmup_cosine) to from_deepspeed"
)


def is_deepspeed_config(config: Mapping[str, Any]) -> bool:
    """True for a dict with a key only DeepSpeed configs have (``zero_optimization``,
    ``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``allgather_base_size``,
    ``reduce_scatter_base_size``)."""
    return any(key in config for key in DEEPSPEED_MARKERS)


_ACCEPTED_TOP_LEVEL: dict[str, tuple[Any, str]] = {
    "wall_clock_breakdown": (False, "reports its own timings (samples_per_sec, profiler)"),
    "prescale_gradients": (False, "averages gradients after summing them"),
    "gradient_predivide_factor": (1.0, "averages gradients after summing them"),
}


def training_fields_from_deepspeed(ds_config: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """The :class:`~ace3.config.training.TrainingConfig` fields for a DeepSpeed dict and the
    keyword ``fields`` (``TrainingConfig.from_deepspeed`` validates them); see the module
    docstring."""
    if not isinstance(ds_config, Mapping):
        raise TypeError(f"ds_config must be a dict, not {type(ds_config).__name__}")
    world_size = int(fields.get("num_gpus", 1)) * int(fields.get("num_nodes", 1))
    mapping = DeepSpeedMapping(world_size)
    ds_config = _without_auto(ds_config, "", mapping)
    mapping.batch(ds_config)
    sections: dict[str, Callable[[Mapping[str, Any]], None]] = {
        "fp16": mapping.fp16,
        "bf16": mapping.bf16,
        "amp": mapping.amp,
        "zero_optimization": mapping.zero,
        "optimizer": mapping.optimizer,
    }
    for key, value in ds_config.items():
        if key in (
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
        ):
            continue
        if key in sections:
            if value is not None:
                sections[key](read_section(value, key))
        elif key == "scheduler":
            kind = read_section(value, key).get("type", "scheduler")
            mapping.refuse(
                "scheduler.type" if "type" in value else key, _SCHEDULER_REASON.format(kind=kind)
            )
        elif key == "gradient_clipping":
            clip = read_number(value, key)
            mapping.fields["max_grad_norm"] = float(clip) if clip > 0 else None
        elif key == "steps_per_print":
            mapping.fields["log_interval"] = read_number(value, key, integer=True, minimum=1)
        elif key == "zero_allow_untested_optimizer":
            read_flag(value, key)  # a permission for client optimizers: the same run either way
        elif key == "allgather_base_size":
            read_number(value, key, integer=True, minimum=1)  # (checked against the stage below)
        elif key in _COMMUNICATION_KEYS:
            _communication(key, value, mapping)
        elif key in _ACCEPTED_TOP_LEVEL:
            expected, meaning = _ACCEPTED_TOP_LEVEL[key]
            mapping.accept_only(key, value, expected, meaning)
        else:
            mapping.refuse(key, "not supported by ACE3's DeepSpeed mapping")
    stage = mapping.fields.get("zero_stage", 0)
    if mapping.fields.get("offload_optimizer") or mapping.fields.get("offload_parameters"):
        stage = max(stage, 3)  # (offload runs ZeRO-3 at stage 0)
    if "ddp_bucket_cap_mb" in mapping.fields and stage >= 2:
        mapping.refuse("reduce_scatter_base_size", _FSDP_BUCKET_REASON)
    if "allgather_base_size" in ds_config and stage >= 1:
        mapping.refuse("allgather_base_size", _ALLGATHER_REASON)
    precisions = [k for k in ("fp16", "bf16", "amp") if _enabled(ds_config.get(k))]
    if len(precisions) > 1:
        mapping.refuse(
            f"{precisions[1]}.enabled",
            f"{' and '.join(precisions)} are both enabled: enable one precision",
        )
    if mapping.problems:
        _raise(mapping.problems)
    clash = sorted(set(fields) & set(mapping.fields))
    if clash:
        raise ValueError(
            f"{', '.join(clash)} {'is' if len(clash) == 1 else 'are'} set by the DeepSpeed "
            "config already: pass it there, or drop it from the keyword arguments"
        )
    return {**mapping.fields, **fields}


_COMMUNICATION_KEYS = ("communication_data_type", "reduce_scatter_base_size")
_ALLGATHER_REASON = (
    "has no meaning here: ZeRO-2/3 run on FSDP2, which all-gathers each unit's parameters (one "
    "layer of the model) in one collective, and ZeRO-1 broadcasts each rank's updated "
    "parameters; neither has a bucket size to set (at zero_stage 0 nothing is all-gathered and "
    "it is accepted): remove it"
)
_FSDP_BUCKET_REASON = (
    "has no meaning at ZeRO-2/3: FSDP2 reduce-scatters each unit's gradients in one "
    "collective, with no bucket to size (it is DDP's bucket_cap_mb at zero_stage 0 or 1): "
    "remove it"
)


def _communication(key: str, value: Any, mapping: DeepSpeedMapping) -> None:
    """``communication_data_type`` -> the same field; ``reduce_scatter_base_size`` (elements of
    float32 gradients) -> ``ddp_bucket_cap_mb``, the nearest knob (DDP's gradient buckets);
    ``allgather_base_size`` is read in the caller (accepted at ZeRO-0, where nothing is
    all-gathered; refused at 1-3, where nothing has a bucket size to set)."""
    if key == "communication_data_type":
        if value is None:
            return
        if value not in ("fp32", "fp16", "bf16"):
            raise ValueError(
                f"DeepSpeed config communication_data_type: expected 'fp32', 'fp16' or 'bf16', "
                f"got {value!r}"
            )
        mapping.fields["communication_data_type"] = value
    elif key == "reduce_scatter_base_size":
        elements = read_number(value, key, integer=True, minimum=1)
        mapping.fields["ddp_bucket_cap_mb"] = elements * 4 / 2**20


def _enabled(section: Any) -> bool:
    return isinstance(section, Mapping) and section.get("enabled") is True


def _without_auto(
    section: Mapping[str, Any], path: str, mapping: DeepSpeedMapping
) -> dict[str, Any]:
    """``section`` without its ``"auto"`` values (placeholders the Hugging Face Trainer fills
    in), each refused, so the rest is still checked and every problem is reported at once."""
    kept: dict[str, Any] = {}
    for key, value in section.items():
        where = f"{path}.{key}" if path else str(key)
        if isinstance(value, str) and value == "auto":
            mapping.refuse(where, "'auto' is filled in by the Hugging Face Trainer: give the value")
        elif isinstance(value, Mapping):
            kept[key] = _without_auto(value, where, mapping)
        else:
            kept[key] = value
    return kept


def _raise(problems: list[ConfigProblem]) -> None:
    raise UnsupportedFeatureError(
        "this DeepSpeed config has keys ACE3 cannot honour exactly:\n"
        + "\n".join(f"  - {problem.reason}" for problem in problems),
        problems,
    )
