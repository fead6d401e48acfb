"""Tensor-parallel plans (``tensor_parallel_size``, or ``parallelism='model'`` with
``model_sharding_strategy='tensor'``) on ``torch.distributed.tensor.parallel``.

The model (or a pipeline stage) is sharded over the 1-D device mesh of its tensor-parallel
ranks with ``parallelize_module``. The plan:

- the model file's ``tensor_parallel_plan(model) -> dict[str, ParallelStyle]`` (module names
  of ``model`` to ``ColwiseParallel()``, ``RowwiseParallel()``, ...) when it defines one;
- otherwise an automatic plan: inside every ``nn.Sequential``, a ``Linear`` followed (through
  element-wise layers only: activations, dropout, identity) by another ``Linear`` becomes a
  pair, the first ``ColwiseParallel`` (its output features split over the ranks) and the
  second ``RowwiseParallel`` (its input features split; the partial outputs are all-reduced).
  The hidden activation between them stays sharded, so each pair costs one all-reduce forward
  and one backward. A pair whose hidden width does not divide by the number of processes is
  left whole. Every other layer is replicated: every rank computes it on the same inputs, so
  its gradients agree without any synchronisation.

Every rank of the mesh reads the same batches. Dropout between a pair's layers draws each rank's shard of
the mask from that rank's own generator.
"""

from __future__ import annotations

from typing import Any

from torch import nn

ELEMENTWISE = (
    nn.ReLU,
    nn.ReLU6,
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.LeakyReLU,
    nn.ELU,
    nn.Mish,
    nn.Softplus,
    nn.Hardswish,
    nn.Hardtanh,
    nn.Dropout,
    nn.Identity,
)


def linear_pairs(model: nn.Module, ways: int) -> list[tuple[str, str]]:
    """``(first, second)`` module names of the Linear pairs of the automatic plan (see the
    module docstring) whose hidden width divides by ``ways``."""
    pairs: list[tuple[str, str]] = []
    for prefix, module in model.named_modules():
        if not isinstance(module, nn.Sequential):
            continue
        children = list(module.named_children())
        i = 0
        while i < len(children):
            name, child = children[i]
            if isinstance(child, nn.Linear):
                j = i + 1
                while j < len(children) and isinstance(children[j][1], ELEMENTWISE):
                    j += 1
                if j < len(children) and isinstance(children[j][1], nn.Linear):
                    second = children[j][1]
                    assert isinstance(second, nn.Linear)
                    if child.out_features % ways == 0 and second.in_features == child.out_features:
                        base = f"{prefix}." if prefix else ""
                        pairs.append((base + name, base + children[j][0]))
                        i = j + 1
                        continue
            i += 1
    return pairs


def automatic_plan(model: nn.Module, ways: int) -> dict[str, Any]:
    """The automatic plan: ``ColwiseParallel`` then ``RowwiseParallel`` for each pair."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    for first, second in linear_pairs(model, ways):
        plan[first] = ColwiseParallel()
        plan[second] = RowwiseParallel()
    return plan


def parallelize(model: nn.Module, mesh: Any, user_module: Any = None, required: bool = True) -> str:
    """Shard ``model`` in place over the 1-D ``mesh`` of its tensor-parallel ranks; return
    what rank 0 logs. With nothing to shard: an error when ``required``, else the model stays
    replicated over the mesh (a pipeline stage without a Linear pair)."""
    from torch.distributed.tensor.parallel import parallelize_module

    ways = mesh.size()

    custom = getattr(user_module, "tensor_parallel_plan", None) if user_module else None
    if custom is not None:
        plan = dict(custom(model))
        source = "tensor_parallel_plan from the model file"
    else:
        plan = automatic_plan(model, ways)
        source = "automatic plan (Linear pairs: ColwiseParallel, then RowwiseParallel)"
    if not plan and not required:
        return "nothing to shard (no Linear pair): replicated on its tensor-parallel ranks"
    if not plan:
        raise ValueError(
            "model_sharding_strategy='tensor' found nothing to shard: the automatic plan needs "
            "two nn.Linear layers in a row inside an nn.Sequential (only element-wise layers "
            f"between them) with a hidden width divisible by {ways}; or define "
            "tensor_parallel_plan(model) -> {module name: ColwiseParallel() | "
            "RowwiseParallel() | ...} in the model file"
        )
    names = dict(model.named_modules())
    unknown = sorted(name for name in plan if name not in names)
    if unknown:
        raise ValueError(
            f"the tensor-parallel plan names modules the model does not have: {unknown}; "
            f"the model's modules include {sorted(n for n in names if n)[:10]}"
        )
    parallelize_module(model, mesh, plan)
    styles = ", ".join(f"{name}: {type(style).__name__}" for name, style in plan.items())
    return (
        f"model parallel (tensor) over {ways} process(es), {source}: {styles}; other "
        "layers replicated"
    )
