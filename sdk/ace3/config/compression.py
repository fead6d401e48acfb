"""The compression settings of :class:`~ace3.config.training.TrainingConfig`: ``pruning``
(magnitude pruning on a schedule during training) and ``quantization`` (an int8 model after
training). Kept apart so that the training schema stays readable; ``TrainingConfig`` inherits
them. What the engine does with them: :mod:`ace3.runtime.techniques.pruning`,
:mod:`ace3.runtime.techniques.quantization`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ace3.config.fine_tuning import MAX_PATTERNS, ParameterPattern

#: The training batches a ``method='static'`` quantization calibrates on unless told.
DEFAULT_CALIBRATION_STEPS = 100


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PruningConfig(_Section):
    """L1 (magnitude) unstructured pruning of the model's Linear and Conv weights while it
    trains (``torch.nn.utils.prune``). The sparsity rises from ``initial_sparsity`` at
    ``begin_step`` to ``target_sparsity`` at ``end_step``, in steps every ``frequency``
    optimizer steps: ``cubic`` is Zhu & Gupta's schedule (fast first, slow at the end),
    ``linear`` even steps, ``oneshot`` the whole target at ``begin_step``. A pruned weight stays
    pruned; the final checkpoint and model hold the zeros under their plain names."""

    target_sparsity: float = Field(
        ..., gt=0.0, lt=1.0, description="Fraction of the pruned weights set to zero at the end."
    )
    schedule: Literal["cubic", "linear", "oneshot"] = Field(
        "cubic", description="How sparsity rises from begin_step to end_step."
    )
    begin_step: int = Field(0, ge=0, description="Optimizer step of the first pruning.")
    end_step: int | None = Field(
        None,
        ge=1,
        description="Optimizer step where target_sparsity is reached (default: the run's last "
        "step). Not used by schedule='oneshot'.",
    )
    frequency: int = Field(
        10, ge=1, le=1_000_000, description="Optimizer steps between pruning steps."
    )
    initial_sparsity: float = Field(
        0.0, ge=0.0, lt=1.0, description="Sparsity the schedule starts from at begin_step."
    )
    scope: Literal["global", "layer"] = Field(
        "global",
        description="global: one magnitude threshold over every pruned weight "
        "(global_unstructured); layer: each layer pruned to the sparsity on its own.",
    )
    target_modules: list[ParameterPattern] | None = Field(
        None,
        max_length=MAX_PATTERNS,
        description="Module-name patterns (fnmatch) of the Linear/Conv layers to prune "
        "(default: all of them).",
    )

    @model_validator(mode="after")
    def _schedule_fits(self) -> PruningConfig:
        if self.initial_sparsity >= self.target_sparsity:
            raise ValueError(
                f"initial_sparsity ({self.initial_sparsity}) must be below target_sparsity "
                f"({self.target_sparsity})"
            )
        if self.schedule == "oneshot" and self.end_step is not None:
            raise ValueError(
                "end_step is not used by schedule='oneshot' (it prunes to target_sparsity at "
                "begin_step): remove it, or use schedule='cubic' or 'linear'"
            )
        if self.end_step is not None and self.end_step <= self.begin_step:
            raise ValueError(
                f"end_step ({self.end_step}) must be after begin_step ({self.begin_step})"
            )
        return self


class QuantizationConfig(_Section):
    """Post-training quantization: after the final checkpoint, the trained model's Linear
    layers become int8 (torchao: int8 weights per output channel; activations quantized per
    row at run time with ``dynamic``, or with fixed per-tensor scales measured on
    ``calibration_steps`` training batches with ``static``). The job writes the int8 model as
    an artifact (``quantized/model-int8.safetensors``: plain tensors, no pickled code; load it
    with :func:`ace3.load_quantized_model`) and reports its size and validation metrics next
    to the float model's."""

    precision: Literal["int8"] = Field("int8", description="The quantized weight type.")
    method: Literal["dynamic", "static"] = Field(
        "dynamic",
        description="dynamic: activation scales computed per input at run time; static: "
        "fixed activation scales calibrated on training batches.",
    )
    calibration_steps: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="method='static': training batches (global) that calibrate the "
        f"activation ranges (default {DEFAULT_CALIBRATION_STEPS}); not used by 'dynamic'.",
    )
    target_modules: list[ParameterPattern] | None = Field(
        None,
        max_length=MAX_PATTERNS,
        description="Module-name patterns (fnmatch) of the Linear layers to quantize "
        "(default: all of them).",
    )

    @model_validator(mode="after")
    def _calibration_is_static(self) -> QuantizationConfig:
        # On its value, not on whether it was set: a config sent with its defaults filled in
        # (model_dump) must mean what the config in process meant.
        if self.method == "dynamic" and self.calibration_steps is not None:
            raise ValueError(
                "calibration_steps is for method='static' (dynamic quantization measures "
                "activations as they come and needs no calibration): remove it, or use "
                "method='static'"
            )
        return self

    @property
    def calibration_batches(self) -> int:
        """The batches a static quantization calibrates on: ``calibration_steps``, or
        :data:`DEFAULT_CALIBRATION_STEPS`."""
        return self.calibration_steps or DEFAULT_CALIBRATION_STEPS


class CompressionFields(BaseModel):
    """``pruning`` / ``quantization``: see :class:`PruningConfig`, :class:`QuantizationConfig`."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    pruning: PruningConfig | None = Field(
        None, description="Prune weights on a schedule while training."
    )
    quantization: QuantizationConfig | None = Field(
        None, description="Write an int8 model after training, with its metrics."
    )
