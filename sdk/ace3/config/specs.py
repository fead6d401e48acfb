"""Wire schemas for the pieces of a job that are built from user objects on the client.

Optimizers and schedulers built against a local model, callbacks and profilers are carried to
a remote job by what they are (class and settings), never pickled: the engine rebuilds them
from these specs. No torch import here (the API validates jobs with these classes).

Paths in a spec that start with ``artifact://`` name a place under the job's artifact
directory (``output_dir/artifacts/...``); the worker uploads what the engine writes there, and
the SDK copies it to the user's local path as the job runs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ace3.config.scheduler_params import check_scheduler_params

ARTIFACT_SCHEME = "artifact://"


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


SchedulerName = Literal[
    "cosine", "warmup_cosine", "polynomial", "warmup", "step", "linear", "exponential", "plateau"
]


class SchedulerSpec(_Spec):
    """A learning-rate schedule: ``name`` and its keyword arguments (see ``ace3.training.schedulers``).

    Every schedule but ``plateau`` advances once per optimizer step; ``plateau`` once per
    validation, on ``monitor``. ``params`` are checked against
    ``ace3.config.scheduler_params.SCHEDULER_PARAMS`` (names, types, ranges), so a typo or a bad value
    is refused at submission. ``cosine.T_max``, ``warmup_cosine.total_steps`` and
    ``polynomial.total_steps`` may be left out: the engine then uses the job's total number of
    optimizer steps.
    """

    name: SchedulerName
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _params_fit_the_schedule(
        cls, params: dict[str, Any], info: ValidationInfo
    ) -> dict[str, Any]:
        name = info.data.get("name")
        if name is None:  # the name itself was refused; that error says enough
            return params
        return check_scheduler_params(name, params)


class CallbackSpec(_Spec):
    """A callback: a built-in one by class name and init arguments, or a user subclass of
    ``ace3.Callback`` by its source code and its instance attributes (built by
    ``ace3.training.callbacks.transport.callback_spec``; rebuilt by ``callbacks_from_specs``).

    ``params`` values are JSON; a non-finite float is written ``{"__ace3_float__": "inf"}``.
    """

    kind: Literal["builtin", "source"]
    name: str = Field(min_length=1, max_length=200, description="Class name.")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="builtin: init keyword arguments; source: the instance's attributes.",
    )
    source: str | None = Field(
        None,
        max_length=1_000_000,
        description="kind=source: module-level code defining the class (and its imports).",
    )

    @model_validator(mode="after")
    def _source_matches_kind(self) -> CallbackSpec:
        if not self.name.isidentifier():
            raise ValueError(f"name {self.name!r} must be a Python class name")
        if self.kind == "source" and not (self.source and self.source.strip()):
            raise ValueError("kind='source' needs the class's source code in 'source'")
        if self.kind == "builtin" and self.source is not None:
            raise ValueError("kind='builtin' takes no 'source': built-ins are named by 'name'")
        return self


def _cpu_only() -> list[Literal["cpu", "cuda"]]:
    return ["cpu"]


class ProfilerSpec(_Spec):
    """torch.profiler on rank 0 (``ace3.TrainingProfiler`` around a remote job).

    Counted in optimizer steps from the start of the attempt: skip ``wait`` steps, warm up for
    ``warmup``, record ``active``; the recording stops at the end of training if that comes
    first. The engine (``ace3.runtime.observe.profiler_hook.ProfilerHook``) writes ``trace.json``
    (Chrome trace) and ``key_averages.json`` (per-operator totals) into ``output_dir``.
    ``cuda`` is dropped, with a warning, on a rank without a GPU.
    """

    activities: list[Literal["cpu", "cuda"]] = Field(
        default_factory=_cpu_only, min_length=1, description="cpu and/or cuda."
    )
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    wait: int = Field(1, ge=0, le=1_000_000)
    warmup: int = Field(1, ge=0, le=1_000_000)
    active: int = Field(20, ge=1, le=100_000)
    output_dir: str = Field(ARTIFACT_SCHEME + "profiler", min_length=1)

    @field_validator("activities")
    @classmethod
    def _unique_activities(cls, activities: list[str]) -> list[str]:
        return list(dict.fromkeys(activities))


class TensorBoardSpec(_Spec):
    """TensorBoard event files written by rank 0 (scalars always; graph, images, histograms
    on request). ``log_dir``: ``artifact://...`` for a remote job (the SDK copies the files to
    the user's directory), or a path on the machine that trains (an in-process run)."""

    log_dir: str = Field(ARTIFACT_SCHEME + "tensorboard", min_length=1)
    log_graph: bool = False
    log_images: bool = False
    log_histograms: bool = False
