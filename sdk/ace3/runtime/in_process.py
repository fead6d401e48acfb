"""In-process training: ``ace3.Trainer(config).train(module, dataset)`` with a live module.

The same engine as a remote job (:mod:`ace3.runtime`: the step runner, precision levels,
schedules, hooks, validation, checkpoints), run in this process on a one-process group (or on
the process group the caller already started, e.g. under their own ``torchrun``). The module is
trained in place (with ``lora``, it gets its own layers back at the end, the adapters merged into
their weights). Imported only when a live ``nn.Module`` is given, so ``import ace3`` stays
free of torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ace3.config import TrainingConfig
from ace3.config.checkpoint_names import CHECKPOINT_NAME_RE
from ace3.config.events import (
    CheckpointRecord,
    EventRecord,
    InstabilityRecord,
    MetricsRecord,
    SummaryRecord,
)
from ace3.locations import refuse_url
from ace3.runtime.build import build_local
from ace3.runtime.checkpoint.files import load_checkpoint
from ace3.runtime.data.dataset_files import make_dataset
from ace3.runtime.data.datasets import DEFAULT_VALIDATION_SPLIT, load_dataset, split_holdout
from ace3.runtime.job_spec import DatasetSpec
from ace3.runtime.loop.hooks import TrainingHook
from ace3.runtime.loop.loop import RunPlace, TrainingLoop
from ace3.runtime.loop.speed import speed_settings, uncompile
from ace3.runtime.observe.hook_factory import engine_hooks
from ace3.runtime.observe.log import ENGINE
from ace3.runtime.observe.memory_meter import PeakMemoryMeter
from ace3.runtime.observe.reporting import EventWriter
from ace3.runtime.process.distributed import destroy_distributed, init_distributed
from ace3.runtime.techniques.lora import remove_adapters
from ace3.runtime.user_code import LossFn, MetricsFn, UserCode


@dataclass
class InProcessRun:
    """What an in-process run reported (rank 0's events): ``history`` (metric name ->
    ``[(step, value), ...]``), the final metrics, the checkpoint files still on disk and the
    instability guard's records (``instability``)."""

    history: dict[str, list[tuple[int, float]]]
    final_metrics: dict[str, Any]
    checkpoints: list[Path]
    best_checkpoint: Path | None = None  # keep_best_checkpoint: the best by its monitor
    instabilities: list[InstabilityRecord] = field(default_factory=list)


class _Collector:
    """Receives the engine's events (rank 0) and keeps what the result needs."""

    def __init__(self) -> None:
        self.history: dict[str, list[tuple[int, float]]] = {}
        self.final: dict[str, Any] = {}
        self.checkpoints: list[Path] = []
        self.best: Path | None = None
        self.instabilities: list[InstabilityRecord] = []

    def __call__(self, record: EventRecord) -> None:
        if isinstance(record, MetricsRecord):
            for name, value in record.values.items():
                if value is not None:
                    self.history.setdefault(name, []).append((record.step, float(value)))
        elif isinstance(record, CheckpointRecord):
            self.checkpoints.append(Path(record.path))
            if record.best:
                self.best = Path(record.path)
        elif isinstance(record, SummaryRecord):
            self.final = dict(record.final_metrics)
        elif isinstance(record, InstabilityRecord):
            self.instabilities.append(record)

    def run(self) -> InProcessRun:
        return InProcessRun(
            history=self.history,
            final_metrics=self.final,
            checkpoints=[p for p in self.checkpoints if p.exists()],
            best_checkpoint=self.best if self.best is not None and self.best.exists() else None,
            instabilities=list(self.instabilities),
        )


@dataclass
class LocalData:
    train: Dataset[Any]
    validation: Dataset[Any] | None
    collate_fn: Callable[[list[Any]], Any] | None = None
    batch_size: int | None = None  # from a DataLoader the user passed


def _as_dataset(data: Any, role: str) -> tuple[Dataset[Any], Any, int | None]:
    """(dataset, collate_fn, loader batch size) from what the user passed for ``role``."""
    if isinstance(data, DataLoader):
        return data.dataset, data.collate_fn, data.batch_size
    if isinstance(data, (str, os.PathLike)):
        refuse_url(data, role)
        loaded = load_dataset(DatasetSpec(path=os.fspath(data)), "train")
        if loaded is None:
            raise ValueError(f"{role} {os.fspath(data)!r}: its dataset.py gave no 'train' split")
        return loaded, None, None
    if (
        isinstance(data, tuple)
        and len(data) == 2
        and all(isinstance(x, torch.Tensor) for x in data)
    ):
        return make_dataset(data[0], data[1], Path(role)), None, None
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return data, None, None
    kind = type(data).__name__
    if kind in {"DatasetRef", "Dataset"} and type(data).__module__.startswith("ace3."):
        raise TypeError(
            f"{role} is a dataset stored on the ACE3 service ({kind}) but the model is a live "
            "nn.Module: local training needs local data (a torch Dataset, a DataLoader, an "
            "(inputs, targets) tuple of tensors or a file path); to train on the service, pass "
            "client.load_model('model.py') as the model"
        )
    raise TypeError(
        f"{role} must be a torch Dataset (map-style), a DataLoader, an (inputs, targets) tuple "
        f"of tensors or a path to a data file, not {kind}"
    )


def resolve_local_data(train: Any, validation: Any, config: TrainingConfig) -> LocalData:
    """Training and validation data, with the same hold-out rule as a remote job."""
    train_set, collate, batch_size = _as_dataset(train, "dataset")
    validation_set = None
    if validation is not None:
        validation_set, _, _ = _as_dataset(validation, "validation_dataset")
    elif config.validation_split != 0:
        fraction = config.validation_split or DEFAULT_VALIDATION_SPLIT
        train_set, validation_set = split_holdout(train_set, fraction, config.seed)
    return LocalData(train_set, validation_set, collate, batch_size)


def _user_code(compute_loss: LossFn | None, compute_metrics: MetricsFn | None) -> UserCode:
    return UserCode(
        module=ModuleType("ace3_local_run"),
        factory=lambda: None,
        factory_name="<live module>",
        compute_loss=compute_loss,
        compute_metrics=compute_metrics,
    )


def latest_checkpoint_in(directory: Path) -> Path | None:
    """The newest ``step-*.pt`` file of ``directory`` (by step), if any."""
    if not directory.is_dir():
        return None
    found = [
        (int(m.group(1)), p) for p in directory.iterdir() if (m := CHECKPOINT_NAME_RE.match(p.name))
    ]
    return max(found)[1] if found else None


def train_in_process(
    config: TrainingConfig,
    module: nn.Module,
    dataset: Any,
    validation_dataset: Any = None,
    *,
    hooks: Sequence[TrainingHook] = (),
    checkpoint_dir: Path | None = None,
    keep_checkpoints: int | None = None,
    resume_from: Path | None = None,
    init_from: Path | None = None,
    compute_loss: LossFn | None = None,
    compute_metrics: MetricsFn | None = None,
    on_memory: Callable[[Mapping[str, Any]], None] | None = None,
) -> InProcessRun:
    """Train ``module`` in this process with the engine; see the module docstring."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(module).__name__}")
    data = resolve_local_data(dataset, validation_dataset, config)
    if data.batch_size is not None and data.batch_size != config.batch_size:
        ENGINE.info(
            f"note: using the DataLoader's batch_size={data.batch_size} "
            f"(the config said {config.batch_size})"
        )
        config = config.model_copy(update={"batch_size": data.batch_size})
    created_group = not (dist.is_available() and dist.is_initialized())
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    ctx = init_distributed(config, default_device=default_device)
    memory = PeakMemoryMeter(ctx.device)
    memory.start()
    try:
        with speed_settings(config, ctx.device):
            ckpt = load_checkpoint(resume_from, None) if resume_from is not None else None
            parts = build_local(
                config, ctx, _user_code(compute_loss, compute_metrics), module,
                data.train, data.validation, ckpt, str(resume_from) if resume_from else None,
                init_from=init_from,
            )  # fmt: skip
            parts.collate_fn = data.collate_fn
            collector = _Collector()
            output_dir = checkpoint_dir.parent if checkpoint_dir is not None else Path.cwd()
            place = RunPlace(
                label="local run",
                output_dir=output_dir,
                checkpoint_dir=checkpoint_dir,
                resumed=ckpt is not None,
                keep_checkpoints=keep_checkpoints,
            )
            events = EventWriter(None, enabled=ctx.is_main, sink=collector)
            all_hooks = engine_hooks(config, ctx, extra=hooks)
            trainer = TrainingLoop(place, ctx, parts, all_hooks, events=events, memory=memory)
            try:
                trainer.run()
                parts.precision.restore_model(module)
            finally:
                remove_adapters(module, merge=True)  # LoRA: its own layers, the adapters merged
                uncompile(module)  # compile=True: the caller's module runs eagerly again
            if on_memory is not None:
                on_memory(dict(collector.final))
            return collector.run()
    finally:
        memory.stop()
        if created_group:
            destroy_distributed()
