"""The profiler's options: :class:`ProfilerActivity` and the checks of ``TrainingProfiler``'s
arguments (activities, flags, ``schedule_steps``). No torch import at module level."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = ["ProfilerActivity", "check_activity", "check_flag", "check_schedule"]


class ProfilerActivity(StrEnum):
    """What to profile: ``CPU`` operators, ``CUDA`` kernels (mirrors
    ``torch.profiler.ProfilerActivity``)."""

    CPU = "cpu"
    CUDA = "cuda"

    def to_torch(self) -> Any:
        from torch.profiler import ProfilerActivity as TorchActivity

        return TorchActivity.CPU if self is ProfilerActivity.CPU else TorchActivity.CUDA


def check_activity(value: Any) -> ProfilerActivity:
    if isinstance(value, ProfilerActivity):
        return value
    if isinstance(value, str) and value.lower() in ("cpu", "cuda"):
        return ProfilerActivity(value.lower())
    name = getattr(value, "name", None)  # torch.profiler.ProfilerActivity.CPU / .CUDA
    if type(value).__name__ == "ProfilerActivity" and name in ("CPU", "CUDA"):
        return ProfilerActivity(name.lower())
    raise ValueError(
        f"activities: unsupported activity {value!r}; use ace3.ProfilerActivity.CPU or "
        "ace3.ProfilerActivity.CUDA (or 'cpu' / 'cuda')"
    )


def check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_schedule(value: Any) -> tuple[int, int, int] | None:
    if value is None:
        return None
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 3
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or value[0] < 0
        or value[1] < 0
        or value[2] < 1
    ):
        raise ValueError(
            f"schedule_steps must be (wait, warmup, active) integers with wait >= 0, "
            f"warmup >= 0, active >= 1, got {value!r}"
        )
    return (value[0], value[1], value[2])
