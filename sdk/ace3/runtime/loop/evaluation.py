"""Validation over the whole validation set, exact across ranks.

Every rank evaluates its own shard (no duplicates), then the summed loss, correct count, sample
count and any ``compute_metrics`` sums are all-reduced. ``val_accuracy`` is reported only when
every batch was class logits ``[N, C]`` with integer targets ``[N]``.

``lockstep=True`` is for sharded models (ZeRO-2/3), whose forward passes are collectives
(parameters are all-gathered): ranks agree on the largest number of batches any of them has,
and a rank with fewer runs the same forward passes on a padding batch (its last one, or the
first sample of the set) whose results are not counted. A loader of unknown length (a
streamed validation set, a user's ``IterableDataset``) agrees batch by batch instead: before each
one the ranks agree whether any has a batch left, and a rank that never had one borrows the first
batch of the lowest rank that has (a broadcast) to pad with. :func:`lockstep_batches` is that
pass, for a strategy that runs its own forward passes (the pipeline).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, default_collate

from ace3.runtime.loop.losses import batch_size_of, count_correct, forward_loss, move_to_device
from ace3.runtime.loop.precision import Precision
from ace3.runtime.user_code import UserCode

MAX_LOG_PERPLEXITY = 100.0


def _padded(loader: DataLoader[Any], padding_batches: int) -> Iterator[tuple[Any, bool]]:
    """(batch, counted): the loader's batches, then ``padding_batches`` uncounted repeats of
    its last one (or of the set's first sample)."""
    raw = None
    for raw in loader:
        yield raw, True
    if padding_batches:
        if raw is None:
            collate = loader.collate_fn or default_collate
            raw = collate([loader.dataset[0]])
        for _ in range(padding_batches):
            yield raw, False


def _agreed(loader: DataLoader[Any], device: torch.device) -> Iterator[tuple[Any, bool]]:
    """(batch, counted) of a lockstep pass over a loader without a length (see the module
    docstring): every rank yields as many as the rank with the most batches."""
    batches, padding, first = iter(loader), None, True
    while True:
        raw = next(batches, None)
        if first:  # who has data at all (a rank without borrows a batch to pad with)
            first = False
            has = [False] * dist.get_world_size()
            dist.all_gather_object(has, raw is not None)
            if not any(has):
                return
            if not all(has):
                shared = [raw if dist.get_rank() == has.index(True) else None]
                dist.broadcast_object_list(shared, src=has.index(True))
                padding = shared[0]
        else:
            flag = torch.tensor([0.0 if raw is None else 1.0], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() == 0:
                return
        if raw is not None:
            padding = raw
            yield raw, True
        else:
            yield padding, False


def lockstep_batches(loader: DataLoader[Any], device: torch.device) -> Iterator[tuple[Any, bool]]:
    """(batch, counted) of this rank's pass over ``loader`` in lockstep with every other rank's
    (a collective; see the module docstring): as many on every rank as the rank with the most
    has, the others uncounted padding. A loader of unknown length (a streamed validation set, a
    user's ``IterableDataset``) agrees batch by batch."""
    if isinstance(loader.dataset, IterableDataset):
        return _agreed(loader, device)
    most = torch.tensor([len(loader)], dtype=torch.float64, device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return _padded(loader, int(most.item()) - len(loader))


def _local_sums(
    model: nn.Module,
    batches: Iterable[tuple[Any, bool]],
    device: torch.device,
    precision: Precision,
    user: UserCode,
) -> tuple[list[float], dict[str, float]]:
    """[loss*n, n, correct, non-classification batches] and weighted user metric sums of the
    counted batches (the others are padding: see ``lockstep``)."""
    loss_sum, samples, correct, not_classification = 0.0, 0, 0, 0
    extra: dict[str, float] = {}
    for raw, counted in batches:
        batch = move_to_device(raw, device)
        n = batch_size_of(batch)
        with precision.autocast():
            result = forward_loss(model, batch, user.compute_loss)
        if not counted:
            if user.compute_metrics is not None:
                with precision.autocast():
                    user.compute_metrics(model, batch)
            continue
        loss_sum += float(result.loss.float().item()) * n
        samples += n
        hits = count_correct(result.outputs, result.targets)
        if hits is None:
            not_classification += 1
        else:
            correct += hits
        if user.compute_metrics is not None:
            with precision.autocast():
                values = user.compute_metrics(model, batch)
            for name, value in dict(values).items():
                extra[name] = extra.get(name, 0.0) + float(value) * n
    return [loss_sum, float(samples), float(correct), float(not_classification)], extra


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader[Any],
    device: torch.device,
    precision: Precision,
    user: UserCode,
    lockstep: bool = False,
    reduce_device: torch.device | None = None,
) -> dict[str, float]:
    """``val_loss`` (and ``val_accuracy``, ``val_<metric>``) over the whole validation set;
    for a Hugging Face language model also ``val_perplexity``, ``exp(val_loss)`` (the loss
    capped at :data:`MAX_LOG_PERPLEXITY`, so that it stays finite).

    ``model`` is the unwrapped module (not DDP): ranks may see different numbers of batches,
    unless ``lockstep`` (a sharded model; see the module docstring). ``reduce_device``: where
    the sums are reduced when the model runs elsewhere (a CPU model in a NCCL job).
    """
    batches: Iterable[tuple[Any, bool]] = _padded(loader, 0)
    if lockstep and dist.is_initialized() and dist.get_world_size() > 1:
        batches = lockstep_batches(loader, device)
    was_training = model.training
    model.eval()
    try:
        sums, extra = _local_sums(model, batches, device, precision, user)
    finally:
        model.train(was_training)
    names = sorted(extra)
    if user.compute_metrics is not None and dist.is_initialized() and dist.get_world_size() > 1:
        # Metric names can differ between ranks only if user code is rank-dependent; gather them.
        gathered: list[list[str]] = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, names)
        names = sorted({name for rank_names in gathered for name in rank_names})
    vector = torch.tensor(
        sums + [extra.get(name, 0.0) for name in names],
        dtype=torch.float64,
        device=reduce_device or device,
    )
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(vector)
    loss_sum, samples, correct, not_classification = vector[:4].tolist()
    if samples == 0:
        return {}
    metrics = {"val_loss": loss_sum / samples}
    if getattr(user, "source_dir", None) is not None:  # a Hugging Face LM: a per-token loss
        metrics["val_perplexity"] = math.exp(min(metrics["val_loss"], MAX_LOG_PERPLEXITY))
    if not_classification == 0:
        metrics["val_accuracy"] = correct / samples
    for name, total in zip(names, vector[4:].tolist(), strict=True):
        metrics[f"val_{name}"] = total / samples
    return metrics
