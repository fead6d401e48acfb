"""The training loop: optimizer steps, metrics, validation, schedules, hooks and saves.

One optimizer step consumes ``gradient_accumulation_steps`` per-rank micro-batches (fewer for
the last group of an epoch), run by :class:`ace3.runtime.loop.steps.StepRunner` (loss scaling,
clipping, out-of-memory recovery). Training metrics go out at step 1 and every
``log_interval`` steps; after every epoch, its mean loss (``epoch_train_loss``) with the
validation metrics; checkpoints every ``save_interval`` steps and at the end; a summary last.
Before the first step, a ``start`` record gives the plan (:func:`planned_total_steps`).

A NaN or infinite training loss (watched on the device, read with the sums reduced at each
report and save) stops every rank at once with :class:`ace3.errors.NonFiniteLossError`.
With ``instability`` set, the guard (:mod:`ace3.runtime.loop.instability`) judges every step before
its update and may drop it, roll the run back to its newest checkpoint, or stop it.
Hooks (:mod:`ace3.runtime.loop.hooks`) see every step and epoch; any of them can stop the run.
Extensions (pruning, quantization, batch-size growth, preemption:
:mod:`ace3.runtime.loop.extensions`) act at fixed points: the start, after each step, its end,
around saves, after the final save, and last. The batch plan
(:mod:`ace3.runtime.loop.batch_growth`) sizes each step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ace3.errors import NonFiniteLossError
from ace3.runtime.checkpoint.saver import CheckpointSaver
from ace3.runtime.components import Components
from ace3.runtime.data.loaders import (
    batches_per_epoch,
    example_batch,
    train_loader,
    train_sampler,
    validation_loader,
)
from ace3.runtime.loop.batch_growth import AccumulationPlan
from ace3.runtime.loop.hooks import HookList, RunContext
from ace3.runtime.loop.instability import check_rollback_place, react
from ace3.runtime.loop.metric_window import MetricWindow, NonFiniteLoss
from ace3.runtime.loop.optim import current_learning_rate
from ace3.runtime.loop.rng import rank_seed
from ace3.runtime.loop.run_metrics import RunMetrics, reports_after
from ace3.runtime.loop.step_counts import planned_total_steps, steps_per_epoch
from ace3.runtime.loop.steps import StepRunner
from ace3.runtime.observe.memory_meter import PeakMemoryMeter, max_over_ranks, memory_summary
from ace3.runtime.observe.reporting import EventWriter
from ace3.runtime.process.distributed import DistContext

# The training metrics the summary repeats (their last reported values).
SUMMARY_TRAINING_METRICS = ("train_loss", "kd_loss", "feature_loss", "task_loss", "attention_loss")


@dataclass(frozen=True)
class RunPlace:
    """Where a run writes: ``label`` names it in logs (``job X attempt N`` or ``local run``)."""

    label: str
    output_dir: Path
    checkpoint_dir: Path | None  # None: no checkpoint files (an in-process run without save_dir)
    resumed: bool = False
    keep_checkpoints: int | None = None  # prune checkpoint_dir to the newest N files


class TrainingLoop:
    """Runs one job attempt on this rank (every rank runs the same sequence of collectives)."""

    def __init__(
        self,
        place: RunPlace,
        ctx: DistContext,
        parts: Components,
        hooks: HookList | None = None,
        events: EventWriter | None = None,
        memory: PeakMemoryMeter | None = None,
    ) -> None:
        self.place, self.ctx, self.parts = place, ctx, parts
        self.config = parts.config
        self.state = parts.state
        self.hooks = hooks or HookList()
        self.events = events or EventWriter(place.output_dir / "events.jsonl", enabled=ctx.is_main)
        self.memory = memory
        self.strategy = parts.strategy
        self.extensions = parts.extensions
        # Every rank of a data replica (its stages and tensor shards) reads the same batches.
        data_rank, data_world = self.strategy.dims.replica
        self.counts_samples = self.strategy.dims.counts_samples
        self.steps = StepRunner(parts, ctx, parts.config)
        self.plan = parts.batch_plan or AccumulationPlan(self.config.gradient_accumulation_steps)
        self.sampler = train_sampler(
            parts.train_set, data_rank, data_world, self.config.seed, self.config.shuffle
        )
        self.batches_per_epoch = batches_per_epoch(self.sampler, parts.per_rank_batch)
        self.val_loader = None
        if parts.validation_set is not None:
            self.val_loader = validation_loader(
                parts.validation_set, data_rank, data_world, parts.per_rank_batch,
                self.config.num_workers, pin_memory=ctx.device.type == "cuda",
                collate_fn=parts.collate_fn,
            )  # fmt: skip
        # Since the last metrics event; every step passes through it, so it watches the loss.
        self.window = MetricWindow(ctx.device, ctx.rank, watch_nonfinite=True)
        self.epoch_window = MetricWindow(ctx.device, ctx.rank)  # since the epoch began
        self.window.set_carry(*self.state.carry.get("interval", (0.0, 0.0)))
        self.epoch_window.set_carry(*self.state.carry.get("epoch", (0.0, 0.0)))
        # A resumed run never rewrites the checkpoint it started from.
        self.last_saved_step: int | None = self.state.step if place.resumed else None
        self.save_after_validation = False
        self.validated_step: int | None = None  # the step of the last validation
        self.saver = CheckpointSaver(self, place.checkpoint_dir, place.keep_checkpoints)
        self.stop_requested = False
        self.step_lr: float | None = None  # the learning rate of the last optimizer step
        self.run_metrics = RunMetrics(ctx, self.strategy.dims.dp)
        parts.model.stop_training = False  # type: ignore[assignment]

    # -- reporting --------------------------------------------------------------------------
    def _log(self, message: str) -> None:
        if self.ctx.is_main:
            print(message, flush=True)

    log = _log  # for extensions

    def report_metrics(self, values: dict[str, float]) -> None:
        """For extensions: a metrics event at the current step (every rank calls it)."""
        self._metrics(values)

    def evaluate_model(self) -> dict[str, float]:
        """For extensions: the validation metrics of the model as it is now, without reporting
        them ({} without a validation set). A collective."""
        if self.val_loader is None:
            return {}
        return self.strategy.evaluate(self.parts, self.val_loader)

    def _metrics(self, values: dict[str, float]) -> None:
        self.state.record(values)
        self.events.metrics(self.state.step, self.state.display_epoch(), values)
        self.hooks.on_metrics(self.state.step, self.state.display_epoch(), values)

    def _report_window(self) -> None:
        report = self.window.reduce(self.ctx.world_size)
        train_loss, samples_per_sec = report.loss, report.samples_per_sec
        lr = (
            self.step_lr
            if self.step_lr is not None
            else current_learning_rate(self.parts.optimizer)
        )
        values = {
            "train_loss": train_loss,
            "learning_rate": lr,
            "epoch": float(self.state.display_epoch()),
            **self.plan.report(),  # batch-size growth: the batch_size of the last step
        }
        if not report.steps:  # the guard dropped every step of the span: no loss to report
            del values["train_loss"]
        if samples_per_sec is not None:
            values["samples_per_sec"] = samples_per_sec
        if self.parts.scaler.is_enabled():
            values["loss_scale"] = float(self.parts.scaler.get_scale())
        if self.parts.distiller is not None:  # kd_loss, feature_loss, task_loss (a collective)
            values.update(self.parts.distiller.report())
        values.update(self.run_metrics.report(self))  # grad_norm, per-rank figures (a collective)
        self._metrics(values)
        speed = f" samples/s={samples_per_sec:.0f}" if samples_per_sec is not None else ""
        self._log(
            f"step {self.state.step} epoch {self.state.display_epoch()} "
            f"train_loss={train_loss:.5f} lr={lr:.3g}{speed}"
        )
        if report.nonfinite is not None:
            self._stop_on_nonfinite_loss(report.nonfinite)
        self.window.reset()

    def _stop_on_nonfinite_loss(self, found: NonFiniteLoss) -> None:
        """Record the first non-finite training loss and stop every rank (each one calls this
        at the same reduction, so none is left waiting in a collective)."""
        state = self.state
        error = NonFiniteLossError(found.step, state.step, found.value)
        self.events.nonfinite_loss(
            found.step, state.step, state.display_epoch(), "train_loss", found.value
        )
        self._log(f"stopping at step {state.step}: {error}")
        raise error

    def _validate(self, label: str, with_epoch_loss: bool) -> dict[str, float]:
        values: dict[str, float] = {}
        if with_epoch_loss and self.epoch_window.has_data:
            # Not "train_loss": metrics are keyed by (step, name), and an interval report can
            # share this step.
            values["epoch_train_loss"] = self.epoch_window.reduce(self.ctx.world_size).loss
        if self.val_loader is not None:
            values.update(self.strategy.evaluate(self.parts, self.val_loader))
            self.validated_step = self.state.step
        if values:
            self._metrics(values)
            self._log(f"{label}: " + " ".join(f"{k}={v:.5f}" for k, v in values.items()))
            if self.parts.scheduler is not None:
                self.parts.scheduler.after_validation(values)
        return values

    # -- saving -------------------------------------------------------------------------------
    def _save(self) -> None:
        interval = self.window.global_sums(self.ctx.world_size)
        if interval.nonfinite is not None:  # never save the weights of a diverged run
            self._stop_on_nonfinite_loss(interval.nonfinite)
        epoch = self.epoch_window.global_sums(self.ctx.world_size)
        self.state.carry = {
            "interval": [interval.loss_sum, interval.steps],
            "epoch": [epoch.loss_sum, epoch.steps],
        }
        self.saver.save()  # records it, prunes, calls on_checkpoint (async: once written)
        self.last_saved_step = self.state.step

    def save_model(self, path: Path, weights_only: bool) -> None:
        """For hooks (ModelCheckpoint): the full training checkpoint, or the weights alone, at
        ``path`` (written by rank 0; every rank must call this at the same point)."""
        with contextlib.ExitStack() as stack:
            for extension in self.extensions:
                stack.enter_context(extension.saving())
            self.strategy.checkpoints.save_model_file(self.parts, path, weights_only)

    def _done(self) -> bool:
        max_steps = self.config.max_steps
        return self.stop_requested or (max_steps is not None and self.state.step >= max_steps)

    def _agree_stop(self) -> bool:
        """Any rank's hook or ``model.stop_training`` stops every rank (a collective)."""
        wanted = self.hooks.wants_stop() or bool(getattr(self.parts.model, "stop_training", False))
        if self.ctx.world_size > 1:
            flag = torch.tensor([1.0 if wanted else 0.0], device=self.ctx.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            wanted = bool(flag.item() > 0)
        if wanted and not self.stop_requested:
            self._log(f"stopping at step {self.state.step}: a callback asked to stop training")
        self.stop_requested = self.stop_requested or wanted
        return wanted

    # -- training ---------------------------------------------------------------------------
    def _train_epoch(self) -> None:
        """Train the rest of the current epoch, or until max_steps or a stop request (from
        the restored position after an instability rollback)."""
        while self._train_part():
            pass

    def _train_part(self) -> bool:
        state, parts, config = self.state, self.parts, self.config
        self.sampler.set_epoch(state.epoch)
        loader = train_loader(
            parts.train_set, self.sampler, parts.per_rank_batch, state.batch_in_epoch,
            config.num_workers, rank_seed(config.seed + state.epoch, self.ctx.rank),
            pin_memory=self.ctx.device.type == "cuda", collate_fn=parts.collate_fn,
        )  # fmt: skip
        batches, hooks, plan = iter(loader), self.hooks, self.plan
        while state.batch_in_epoch < self.batches_per_epoch and not self._done():
            group = min(plan.batches_per_step(), self.batches_per_epoch - state.batch_in_epoch)
            batch_index = plan.batch_index(state.batch_in_epoch)
            hooks.on_batch_begin(batch_index)
            self.step_lr = (  # the rate this step uses
                current_learning_rate(parts.optimizer) * plan.lr_factor * state.lr_scale
            )
            taken = plan.combine([next(batches) for _ in range(group)])
            step_loss, samples = self.steps.run(taken, state.step, reports_after(self, group))
            if react(self):  # the guard found the step unstable and rolled the run back
                return True
            state.step += 1
            state.batch_in_epoch += group
            if parts.scheduler is not None:
                parts.scheduler.after_optimizer_step()
            for extension in self.extensions:
                extension.after_step(self)
            self.saver.poll()  # a background save that has finished is recorded
            if not self.counts_samples:
                samples = 0  # every rank of the replica ran the same samples: count them once
            if not self.steps.dropped:  # (a step the guard skipped adds no loss)
                self.window.add(step_loss, samples, state.step)
                self.epoch_window.add(step_loss, samples, state.step)
            if hooks.wants_batch_logs:
                logs = {
                    "loss": float(step_loss.item()),
                    "step": float(state.step),
                    "learning_rate": self.step_lr,
                    "batch_size": float(samples),
                }
                hooks.on_batch_end(batch_index, logs)
            else:
                hooks.on_batch_end(batch_index, {})
            if state.step == 1 or state.step % config.log_interval == 0:
                self._report_window()
            if config.save_interval and state.step % config.save_interval == 0:
                if state.batch_in_epoch >= self.batches_per_epoch:
                    self.save_after_validation = True  # so it holds this epoch's validation
                else:
                    self._save()
            if hooks.checks_stop_every_batch and self._agree_stop():
                break
            for extension in self.extensions:
                extension.step_end(self)
        return False

    def run(self) -> dict[str, Any]:
        """Train to the end; write the final checkpoint and the summary; return final metrics."""
        state, config = self.state, self.config
        parts = self.parts
        self._log(
            f"{self.place.label}: "
            f"{len(self.sampler.dataset)} training samples, "  # type: ignore[arg-type]
            f"{self.batches_per_epoch} micro-batches of {parts.per_rank_batch} per rank "
            f"per epoch, {config.epochs} epoch(s), precision {parts.precision.describe()}"
        )
        self.events.start(
            total_steps=planned_total_steps(
                self.batches_per_epoch, config.gradient_accumulation_steps, config.epochs,
                config.max_steps, state,
            ),
            steps_per_epoch=steps_per_epoch(
                self.batches_per_epoch, config.gradient_accumulation_steps
            ),
            epochs=config.epochs,
            world_size=self.ctx.world_size,
            resumed_from_step=state.step if self.place.resumed else 0,
        )  # fmt: skip
        self.hooks.bind(
            RunContext(
                model=parts.model,
                optimizer=parts.optimizer,
                config=config,
                rank=self.ctx.rank,
                world_size=self.ctx.world_size,
                device=self.ctx.device,
                output_dir=self.place.output_dir,
                scheduler=parts.scheduler.scheduler if parts.scheduler is not None else None,
                save_model=self.save_model,
                example_batch=example_batch(parts, self.sampler, self.ctx.device)
                if self.hooks
                else None,
            )
        )
        validated_at: int | None = None
        try:
            self.hooks.on_train_begin()
            check_rollback_place(self)
            for extension in self.extensions:
                extension.start(self)
            while state.epoch < config.epochs and not self._done():
                self.hooks.on_epoch_begin(state.epoch + 1)
                self._train_epoch()
                if state.batch_in_epoch < self.batches_per_epoch:
                    break  # stopped by max_steps or a callback mid-epoch
                if self.window.has_data:
                    self._report_window()  # the epoch's last steps, before its validation
                values = self._validate(f"epoch {state.epoch + 1} done", with_epoch_loss=True)
                validated_at = state.step
                if self.save_after_validation:
                    self.save_after_validation = False
                    self._save()
                logs = dict(values)
                if "epoch_train_loss" in logs:
                    logs["train_loss"] = logs["epoch_train_loss"]
                self.hooks.on_epoch_end(state.epoch + 1, logs)
                state.epoch += 1
                state.batch_in_epoch = 0
                self.epoch_window.reset()
                self._agree_stop()
            if self.window.has_data:
                self._report_window()
            if validated_at != state.step and self.val_loader is not None:
                self._validate(f"validation at step {state.step}", with_epoch_loss=False)
            if self.last_saved_step != state.step:
                self._save()
            self.saver.close()  # the last checkpoint is written and recorded before the end
            extras: dict[str, Any] = {}
            for extension in self.extensions:
                extras.update(extension.finish(self))
            summary = self._summary(extras)
            self.hooks.on_train_end(dict(summary))
            self.strategy.finish(parts)
            return summary
        finally:
            self.saver.close(failed=True)  # (a no-op after a clean end)
            self.hooks.close()
            self.events.close()
            for extension in self.extensions:
                extension.close()
            if parts.distiller is not None:
                parts.distiller.close()

    def _summary(self, extras: dict[str, Any] | None = None) -> dict[str, Any]:
        state = self.state
        final: dict[str, Any] = {
            key: value
            for key, value in state.last_metrics.items()
            if key in SUMMARY_TRAINING_METRICS or key.startswith("val_")
        }
        if state.best_val_accuracy is not None:
            final["best_val_accuracy"] = state.best_val_accuracy
        final["steps"] = state.step
        final["epochs"] = state.display_epoch()
        if self.memory is not None:
            final.update(self._memory_figures())
        if self.steps.split > 1:
            final["micro_batch_split"] = self.steps.split
        if self.parts.scaler.is_enabled():
            final["skipped_steps"] = self.parts.scaler.skipped_steps
            final["loss_scale"] = float(self.parts.scaler.get_scale())
        final.update(extras or {})
        self.events.summary(final, state.best_val_accuracy, state.step, state.display_epoch())
        self._log("done: " + " ".join(f"{k}={v}" for k, v in final.items()))
        return final

    def _memory_figures(self) -> dict[str, Any]:
        """Peak memory (the rank with the largest) and the training state's size (a
        collective)."""
        assert self.memory is not None
        reading = max_over_ranks(self.memory.reading(), self.ctx.device)
        return memory_summary(reading, self.strategy.state_bytes(self.parts))
