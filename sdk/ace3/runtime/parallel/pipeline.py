"""Pipeline parallelism (``parallelism='pipeline'``, and ``'model'`` with strategy
``'pipeline'`` or ``'layer'``): the model is cut into one stage per pipeline rank
(:mod:`ace3.runtime.parallel.stage_split`) and run by a ``torch.distributed.pipelining``
schedule (:mod:`ace3.runtime.parallel.pipeline_schedule`). ``'layer'`` is the same pipeline
with one micro-batch (the layers are placed on different ranks; no overlap).

Every stage of a replica reads the same batches; the last stage computes the loss and
broadcasts it to its pipeline peers. An out-of-memory step is never split (the stages'
buffers have fixed shapes).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from ace3.config import pipeline_layout
from ace3.runtime.loop.evaluation import lockstep_batches
from ace3.runtime.loop.precision import Precision
from ace3.runtime.observe.log import ENGINE
from ace3.runtime.parallel.base import MicroBatches
from ace3.runtime.parallel.pipeline_schedule import PipelineRunner, broadcast_from_last
from ace3.runtime.parallel.split_model import SplitModel
from ace3.runtime.parallel.stage_split import pipeline_stages
from ace3.runtime.parallel.tensor_plan import parallelize
from ace3.runtime.user_code import UserCode

if TYPE_CHECKING:
    from ace3.runtime.parallel.parts import StepParts


def _stage_label(stage: nn.Module) -> str:
    names = [name for name, _ in stage.named_children()]
    count = sum(p.numel() for p in stage.parameters())
    span = f"layers {names[0]}-{names[-1]}" if len(names) > 1 else f"layer {names[0]}"
    return f"{span} ({count} parameters)" if names else f"{count} parameters"


class PipelineParallel(SplitModel):
    splits_micro_batches = False

    runner: PipelineRunner

    def _group(self) -> Any:
        return self.dims.group(self.ctx.device.type, "pp")

    def _last_stage_rank(self) -> int:
        dims = self.dims
        return dims.global_rank(dims.dp_rank, dims.pp - 1, dims.tp_rank)

    def prepare(
        self,
        model: nn.Module,
        precision: Precision,
        user: UserCode,
        ckpt: dict[str, Any] | None,
        live_module: bool,
    ) -> nn.Module:
        config, ctx, dims = self.config, self.ctx, self.dims
        layout = pipeline_layout(config, ctx.world_size)
        assert layout is not None
        stages_count, micro_batches, schedule = layout
        for name in ("compute_loss", "compute_metrics"):
            if getattr(user, name) is not None:
                raise ValueError(
                    f"{name} in the model file needs the whole model, which no pipeline rank "
                    "holds: remove it (the last stage computes the default loss: cross-entropy "
                    "for integer targets, mean squared error for float ones) or use "
                    "parallelism='data' or model_sharding_strategy='tensor'"
                )
        self.start_split(model, precision, ckpt)
        stages = pipeline_stages(model, stages_count, config.pipeline_split_points, user.module)
        local = stages[dims.pp_rank].to(ctx.device)
        if dims.tp > 1:
            self._shard_stage(local, user)
        precision.prepare_model(local)
        self.shard_replicas(local)
        batch = self.per_rank_batch
        micro_size = batch // micro_batches
        self.runner = PipelineRunner(
            local, dims.pp_rank, stages_count, micro_batches, micro_size, schedule, ctx.device,
            group=self._group(),
        )  # fmt: skip
        if ctx.is_main:
            if config.model_sharding_strategy == "layer":
                ENGINE.info(
                    "model parallel (layer): consecutive layers on "
                    f"{stages_count} process(es), one micro-batch per batch (a pipeline without "
                    "overlap)"
                )
            else:
                ENGINE.info(
                    f"pipeline parallel: {stages_count} stage(s), {schedule} schedule, "
                    f"{micro_batches} micro-batch(es) of {micro_size} per batch of {batch}"
                )
            for i, stage in enumerate(stages):
                rank = dims.global_rank(0, i, 0)
                ENGINE.info(f"stage {i} (rank {rank}): {_stage_label(stage)}")
        return local

    def _shard_stage(self, stage: nn.Module, user: UserCode) -> None:
        """Pipeline x tensor: this stage's Linear pairs sharded over its tensor-parallel peers
        (the automatic plan of :mod:`ace3.runtime.parallel.tensor_plan`)."""
        if getattr(user.module, "tensor_parallel_plan", None) is not None:
            raise ValueError(
                "tensor_parallel_plan in the model file names modules of the whole model; with "
                "pipeline_parallel_size > 1 each stage is sharded by the automatic plan: "
                "remove tensor_parallel_plan, or run tensor parallelism without a pipeline"
            )
        mesh = self.dims.submesh(self.ctx.device.type, "tp")
        describe = parallelize(stage, mesh, None, required=False)
        if self.dims.tp_rank == 0 and self.dims.dp_rank == 0:  # one line per stage
            ENGINE.info(f"stage {self.dims.pp_rank}: {describe}")

    # -- the step -------------------------------------------------------------------------------
    def forward_backward(self, chunks: MicroBatches, parts: StepParts) -> tuple[torch.Tensor, int]:
        """Run the loader batches (accumulated) through the pipeline; the step's mean loss is
        the same on every stage (broadcast from the last)."""
        loss, samples = 0.0, 0
        for batch, weight in chunks:
            with parts.precision.autocast():
                part, count = self.runner.train_batch(batch, weight)
            loss += part
            samples += count
        (loss,) = broadcast_from_last(
            [loss], self._last_stage_rank(), self.ctx.device, self._group()
        )
        return torch.tensor(loss, dtype=torch.float32, device=self.ctx.device), samples

    # -- validation -----------------------------------------------------------------------------
    def evaluate(self, parts: StepParts, loader: Any) -> dict[str, float]:
        """``val_loss`` and ``val_accuracy`` through the pipeline (the last stage counts and
        broadcasts)."""
        runner = self.runner
        runner.reset_sums()
        self._sync_buffers(parts)
        parts.model.eval()
        try:
            # Sharded replicas run their forward passes in lockstep: a replica with fewer
            # batches (or none: a stream's, an IterableDataset's) pads with uncounted passes.
            batches: Iterable[tuple[Any, bool]] = (
                lockstep_batches(loader, self.ctx.device)
                if self.plan is not None
                else ((batch, True) for batch in loader)
            )
            for batch, counted in batches:
                with parts.precision.autocast():
                    runner.eval_batch(batch, counted=counted)
        finally:
            parts.model.train()
            self.after_evaluation(parts)
        sums = broadcast_from_last(
            runner.sums, self._last_stage_rank(), self.ctx.device, self._group()
        )
        if self.dims.dp > 1:  # each replica validated its own shard of the set
            vector = torch.tensor(sums, dtype=torch.float64, device=self.ctx.device)
            dist.all_reduce(vector, group=self._dp_group())
            sums = vector.tolist()
        loss_sum, samples, correct, not_classification = sums
        if samples == 0:
            return {}
        metrics = {"val_loss": loss_sum / samples}
        if not_classification == 0:
            metrics["val_accuracy"] = correct / samples
        return metrics
