"""The sections of a DeepSpeed config dict, read into :class:`~ace3.TrainingConfig` fields.

:class:`DeepSpeedMapping` walks one dict: batch sizes, ``fp16`` / ``bf16`` / ``amp``,
``zero_optimization`` (with offload) and ``optimizer``; it collects the fields they set and
every key it refuses (see :mod:`ace3.config.deepspeed` for the entry point and the full
mapping). A malformed value is a ``ValueError`` naming the key. No torch import here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ace3.config.problem import ConfigProblem

__all__ = ["TUNING_REASON", "DeepSpeedMapping", "read_flag", "read_number", "read_section"]

# A key DeepSpeed reads to tune its own engine; ACE3 has no such knob.
TUNING_REASON = (
    "a DeepSpeed tuning knob with no counterpart in ACE3's engine (PyTorch DDP / FSDP): remove it"
)


def read_number(value: Any, path: str, *, integer: bool = False, minimum: float = 0.0) -> Any:
    kinds: tuple[type[float], ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < minimum:
        what = "an integer" if integer else "a number"
        raise ValueError(f"DeepSpeed config {path}: expected {what} >= {minimum:g}, got {value!r}")
    return value


def read_flag(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"DeepSpeed config {path}: expected true or false, got {value!r}")
    return value


def read_section(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"DeepSpeed config {path}: expected a dict, got {type(value).__name__}")
    return value


class DeepSpeedMapping:
    """Walks one DeepSpeed dict: collects the TrainingConfig fields and the refused keys."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.fields: dict[str, Any] = {}
        self.problems: list[ConfigProblem] = []

    def refuse(self, path: str, reason: str) -> None:
        self.problems.append(ConfigProblem(field=path, reason=f"{path}: {reason}"))

    def accept_only(self, path: str, value: Any, expected: Any, meaning: str) -> None:
        """A key ACE3 honours only at the value it always behaves like."""
        if value != expected:
            self.refuse(path, f"{value!r} is not supported: ACE3 always {meaning} ({expected!r})")

    def unknown(self, section: Mapping[str, Any], known: set[str], prefix: str) -> None:
        for key in section:
            if key not in known:
                self.refuse(f"{prefix}{key}", "not supported by ACE3's DeepSpeed mapping")

    # -- sections -------------------------------------------------------------------------------
    def batch(self, ds: Mapping[str, Any]) -> None:
        train = ds.get("train_batch_size")
        micro = ds.get("train_micro_batch_size_per_gpu")
        accumulation = ds.get("gradient_accumulation_steps")
        if train is None and micro is None and accumulation is None:
            return
        world = self.world_size
        if train is not None:
            read_number(train, "train_batch_size", integer=True, minimum=1)
        if micro is not None:
            read_number(micro, "train_micro_batch_size_per_gpu", integer=True, minimum=1)
        if accumulation is not None:
            read_number(accumulation, "gradient_accumulation_steps", integer=True, minimum=1)
        if train is None and micro is None:
            raise ValueError(
                "DeepSpeed config: gradient_accumulation_steps needs train_batch_size or "
                "train_micro_batch_size_per_gpu"
            )
        if micro is None:
            assert train is not None  # (refused above when both are missing)
            accumulation = accumulation or 1
            if train % (accumulation * world):
                raise ValueError(
                    f"DeepSpeed config: train_batch_size {train} is not divisible by "
                    f"gradient_accumulation_steps {accumulation} x {world} process(es)"
                )
            micro = train // (accumulation * world)
        elif accumulation is None:
            accumulation = 1
            if train is not None:
                if train % (micro * world):
                    raise ValueError(
                        f"DeepSpeed config: train_batch_size {train} is not divisible by "
                        f"train_micro_batch_size_per_gpu {micro} x {world} process(es)"
                    )
                accumulation = train // (micro * world)
        if train is not None and train != micro * accumulation * world:
            raise ValueError(
                f"DeepSpeed config: train_batch_size {train} must equal "
                f"train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps "
                f"{accumulation} x {world} process(es) = {micro * accumulation * world}"
            )
        self.fields["batch_size"] = micro * world  # ACE3's batch_size is the global micro-batch
        self.fields["gradient_accumulation_steps"] = accumulation

    def fp16(self, section: Mapping[str, Any]) -> None:
        known = {
            "enabled", "loss_scale", "initial_scale_power", "loss_scale_window",
            "min_loss_scale", "hysteresis", "consecutive_hysteresis", "auto_cast",
            "fp16_master_weights_and_grads",
        }  # fmt: skip
        self.unknown(section, known, "fp16.")
        enabled = read_flag(section.get("enabled", False), "fp16.enabled")
        if not enabled:
            return
        self.fields.update(mixed_precision=True, amp_dtype="float16", amp_level="O1")
        scale = read_number(section.get("loss_scale", 0), "fp16.loss_scale")
        self.fields["loss_scaling"] = "dynamic" if scale == 0 else float(scale)
        power = read_number(section.get("initial_scale_power", 16), "fp16.initial_scale_power")
        self.fields["init_loss_scale"] = 2.0 ** float(power)
        window = section.get("loss_scale_window", 1000)  # DeepSpeed's default, not ACE3's
        self.fields["loss_scale_window"] = read_number(
            window, "fp16.loss_scale_window", integer=True, minimum=1
        )
        if "min_loss_scale" in section:
            minimum = read_number(section["min_loss_scale"], "fp16.min_loss_scale")
            if minimum <= 0:
                raise ValueError("DeepSpeed config fp16.min_loss_scale: must be > 0")
            self.fields["min_loss_scale"] = float(minimum)
        if "hysteresis" in section:
            self.accept_only(
                "fp16.hysteresis", section["hysteresis"], 1,
                "lowers the loss scale at every overflow",
            )  # fmt: skip
        for key, meaning in (
            ("consecutive_hysteresis", "lowers the loss scale at every overflow"),
            ("auto_cast", "leaves the model's inputs as they are (autocast casts per op)"),
            ("fp16_master_weights_and_grads", "keeps float32 weights and gradients"),
        ):
            if key in section:
                self.accept_only(f"fp16.{key}", section[key], False, meaning)

    def bf16(self, section: Mapping[str, Any]) -> None:
        self.unknown(section, {"enabled"}, "bf16.")
        if read_flag(section.get("enabled", False), "bf16.enabled"):
            self.fields.update(mixed_precision=True, amp_dtype="bfloat16", amp_level="O1")

    def amp(self, section: Mapping[str, Any]) -> None:
        self.unknown(section, {"enabled", "opt_level", "keep_batchnorm_fp32", "loss_scale"}, "amp.")
        if not read_flag(section.get("enabled", False), "amp.enabled"):
            return
        level = section.get("opt_level", "O1")
        if level not in ("O0", "O1", "O2", "O3"):
            raise ValueError(f"DeepSpeed config amp.opt_level: expected O0-O3, got {level!r}")
        self.fields.update(mixed_precision=True, amp_dtype="float16", amp_level=level)
        if "keep_batchnorm_fp32" in section:
            keep = section["keep_batchnorm_fp32"]
            if keep is not None:
                self.fields["keep_batchnorm_fp32"] = read_flag(keep, "amp.keep_batchnorm_fp32")
        if "loss_scale" in section:
            scale = section["loss_scale"]
            if scale == "dynamic":
                self.fields["loss_scaling"] = "dynamic"
            else:
                self.fields["loss_scaling"] = float(read_number(scale, "amp.loss_scale"))

    def zero(self, section: Mapping[str, Any]) -> None:
        known = {"stage", "offload_optimizer", "offload_param"}
        for key in section:
            if key not in known:
                self.refuse(f"zero_optimization.{key}", TUNING_REASON)
        stage = section.get("stage", 0)
        if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
            raise ValueError(
                f"DeepSpeed config zero_optimization.stage: expected 0-3, got {stage!r}"
            )
        self.fields["zero_stage"] = stage
        for key, field in (
            ("offload_optimizer", "offload_optimizer"),
            ("offload_param", "offload_parameters"),
        ):
            if key in section and section[key] is not None:
                self.offload(
                    read_section(section[key], f"zero_optimization.{key}"), key, field, stage
                )

    def offload(self, section: Mapping[str, Any], key: str, field: str, stage: int) -> None:
        prefix = f"zero_optimization.{key}."
        for name in section:
            if name not in ("device", "pin_memory"):
                self.refuse(prefix + name, TUNING_REASON)
        device = section.get("device", "none")
        if device == "none":
            return
        if device != "cpu":
            self.refuse(
                prefix + "device", f"{device!r} is not supported: ACE3 offloads to 'cpu' only"
            )
            return
        if "pin_memory" in section:
            self.accept_only(
                prefix + "pin_memory", read_flag(section["pin_memory"], prefix + "pin_memory"), True,
                "pins offloaded memory on CUDA devices",
            )  # fmt: skip
        if key == "offload_param" and stage != 3:
            self.refuse(
                prefix + "device", f"DeepSpeed offloads parameters at stage 3 only, not {stage}"
            )
            return
        if stage in (0, 1):
            self.refuse(
                prefix + "device",
                f"offload at stage {stage} is not implemented: ACE3 offloads with FSDP at "
                "stages 2 and 3 (set zero_optimization.stage to 2 or 3)",
            )
            return
        self.fields[field] = True

    def optimizer(self, section: Mapping[str, Any]) -> None:
        self.unknown(section, {"type", "params"}, "optimizer.")
        kind = section.get("type")
        if not isinstance(kind, str):
            raise ValueError(f"DeepSpeed config optimizer.type: expected a name, got {kind!r}")
        params = read_section(section.get("params") or {}, "optimizer.params")
        name = kind.lower()
        if name in ("adam", "adamw"):
            adam_w = params.get("adam_w_mode", True) if name == "adam" else True
            self.fields["optimizer"] = (
                "adamw" if read_flag(adam_w, "optimizer.params.adam_w_mode") else "adam"
            )
            self.adam_params(params)
        elif name == "sgd":
            self.fields["optimizer"] = "sgd"
            self.sgd_params(params)
        else:
            self.refuse(
                "optimizer.type",
                f"{kind!r} is not supported: ACE3 maps Adam, AdamW and SGD (for ACE3's "
                "memory-efficient or 8-bit Adam, set optimizer= on the TrainingConfig)",
            )

    def common_params(self, params: Mapping[str, Any]) -> None:
        if "lr" in params:
            lr = read_number(params["lr"], "optimizer.params.lr")
            if lr <= 0:
                raise ValueError("DeepSpeed config optimizer.params.lr: must be > 0")
            self.fields["learning_rate"] = float(lr)
        if "weight_decay" in params:
            wd = read_number(params["weight_decay"], "optimizer.params.weight_decay")
            self.fields["weight_decay"] = float(wd)

    def adam_params(self, params: Mapping[str, Any]) -> None:
        known = {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "torch_adam",
                 "bias_correction", "amsgrad"}  # fmt: skip
        self.unknown(params, known, "optimizer.params.")
        self.common_params(params)
        if "betas" in params:
            betas = params["betas"]
            if not isinstance(betas, (list, tuple)) or len(betas) != 2:
                raise ValueError(
                    f"DeepSpeed config optimizer.params.betas: expected [b1, b2], got {betas!r}"
                )
            self.fields["betas"] = (
                float(read_number(betas[0], "optimizer.params.betas[0]")),
                float(read_number(betas[1], "optimizer.params.betas[1]")),
            )
        if "eps" in params:
            self.fields["eps"] = float(read_number(params["eps"], "optimizer.params.eps"))
        if "bias_correction" in params:
            self.accept_only(
                "optimizer.params.bias_correction", params["bias_correction"], True,
                "applies Adam's bias correction",
            )  # fmt: skip
        if "amsgrad" in params:
            self.accept_only(
                "optimizer.params.amsgrad", params["amsgrad"], False, "runs plain Adam(W)"
            )
        # torch_adam picks DeepSpeed's kernel, not the math: any value is honoured.

    def sgd_params(self, params: Mapping[str, Any]) -> None:
        known = {"lr", "momentum", "weight_decay", "nesterov", "dampening"}
        self.unknown(params, known, "optimizer.params.")
        self.common_params(params)
        # torch.optim.SGD's default momentum is 0 (DeepSpeed passes params to it as given).
        momentum = read_number(params.get("momentum", 0.0), "optimizer.params.momentum")
        if momentum >= 1:
            raise ValueError("DeepSpeed config optimizer.params.momentum: must be < 1")
        self.fields["momentum"] = float(momentum)
        if "nesterov" in params:
            self.accept_only(
                "optimizer.params.nesterov", params["nesterov"], False, "uses plain momentum"
            )
        if "dampening" in params:
            self.accept_only(
                "optimizer.params.dampening", params["dampening"], 0, "applies no dampening"
            )
