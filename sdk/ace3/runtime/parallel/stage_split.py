"""Cut a model into pipeline stages: balanced by parameter count, or at the user's split points.

A pipeline job needs the model as consecutive pieces, one per process. Two ways to get them:

- the model file defines ``pipeline_stages(model, num_stages) -> list[nn.Module]`` (modules of
  ``model``, run one after another; each takes the previous one's output tensor);
- the model is an ``nn.Sequential``: it is cut into ``num_stages`` contiguous slices. Without
  split points the slices minimise the largest stage's parameter count; every stage starts at a
  layer with parameters, so an activation stays with the layer before it.

Slices of an ``nn.Sequential`` keep the original layer names (``model[2:5]`` holds ``"2"``,
``"3"``, ``"4"``), so stage state dicts use the full model's names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn


def _size(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def balanced_split_points(sizes: Sequence[int], num_stages: int) -> list[int]:
    """Start indices of stages 2..``num_stages`` over layers of ``sizes`` parameters that
    minimise the largest stage's total; stages start only at layers with parameters."""
    if num_stages < 1:
        raise ValueError(f"num_stages must be at least 1, got {num_stages}")
    starts = [i for i, size in enumerate(sizes) if size > 0]
    if len(starts) < num_stages:
        raise ValueError(
            f"the model has {len(starts)} layer(s) with parameters, fewer than num_stages="
            f"{num_stages}: every stage needs one; use fewer stages"
        )
    candidates = [0, *starts[1:]]  # stage 1 starts at layer 0 (parameter-free layers included)
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    n, k = len(candidates), num_stages
    end = len(sizes)

    def cost(a: int, b: int) -> int:  # stage from candidates[a] to candidates[b] (or the end)
        stop = candidates[b] if b < n else end
        return prefix[stop] - prefix[candidates[a]]

    # best[j][a]: the smallest largest-stage cost for layers from candidates[a] in j stages.
    inf = float("inf")
    best: list[list[float]] = [[inf] * (n + 1) for _ in range(k + 1)]
    choice: list[list[int]] = [[-1] * (n + 1) for _ in range(k + 1)]
    for a in range(n):
        best[1][a] = cost(a, n)
    for j in range(2, k + 1):
        for a in range(n):
            for b in range(a + 1, n):
                value = max(cost(a, b), best[j - 1][b])
                if value < best[j][a]:
                    best[j][a], choice[j][a] = value, b
    points, a = [], 0
    for j in range(k, 1, -1):
        a = choice[j][a]
        points.append(candidates[a])
    return points


def split_sequential(
    model: nn.Sequential, num_stages: int, split_points: Sequence[int] | None = None
) -> list[nn.Module]:
    """``num_stages`` contiguous slices of ``model`` (sharing its layers)."""
    if split_points is None:
        split_points = balanced_split_points([_size(m) for m in model], num_stages)
    points = list(split_points)
    if len(points) != num_stages - 1 or any(
        b <= a for a, b in zip([0, *points], [*points, len(model)], strict=True)
    ):
        raise ValueError(
            f"pipeline_split_points {points} must be {num_stages - 1} increasing layer indices "
            f"between 1 and {len(model) - 1} (where stages 2..{num_stages} start) for an "
            f"nn.Sequential of {len(model)} layers"
        )
    bounds = [0, *points, len(model)]
    return [model[bounds[i] : bounds[i + 1]] for i in range(num_stages)]


def pipeline_stages(
    model: nn.Module,
    num_stages: int,
    split_points: Sequence[int] | None,
    user_module: Any = None,
) -> list[nn.Module]:
    """The model's stages: the model file's ``pipeline_stages`` if it has one, else slices of an
    ``nn.Sequential`` (see the module docstring)."""
    custom = getattr(user_module, "pipeline_stages", None) if user_module is not None else None
    if custom is not None:
        if split_points is not None:
            raise ValueError(
                "pipeline_split_points and a pipeline_stages function in the model file both "
                "choose the stages: remove one"
            )
        stages = list(custom(model, num_stages))
        if len(stages) != num_stages or not all(isinstance(s, nn.Module) for s in stages):
            raise ValueError(
                f"pipeline_stages(model, {num_stages}) in the model file must return a list of "
                f"{num_stages} nn.Module, got {len(stages)} item(s)"
            )
        owned = {id(p) for p in model.parameters()}
        if any(id(p) not in owned for s in stages for p in s.parameters()):
            raise ValueError(
                "pipeline_stages(model, num_stages) must return submodules of the model (their "
                "parameters must be the model's, so checkpoints keep the model's names)"
            )
        return stages
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            f"pipeline parallelism cuts an nn.Sequential into stages, but the model is a "
            f"{type(model).__name__}: build it as an nn.Sequential, or define "
            "pipeline_stages(model, num_stages) -> list[nn.Module] in the model file"
        )
    return split_sequential(model, num_stages, split_points)
