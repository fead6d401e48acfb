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
Extensions (pruning, quantization, distillation, batch-size growth, preemption:
:mod:`ace3.runtime.loop.extensions`) act at fixed points and see the loop through
:class:`ace3.runtime.loop.view.LoopView`: nothing outside this module assigns its state. The
batch plan (:mod:`ace3.runtime.loop.batch_growth`) sizes each step.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ace3.runtime.checkpoint.saver import CheckpointSaver
from ace3.runtime.components import Components
from ace3.runtime.data.loaders import validation_loader
from ace3.runtime.data.train_source import example_batch
from ace3.runtime.loop.batch_growth import AccumulationPlan
from ace3.runtime.loop.hooks import HookList, RunContext
from ace3.runtime.loop.instability import check_rollback_place, react, rolled_back_state
from ace3.runtime.loop.metric_window import MetricWindow, NonFiniteLoss
from ace3.runtime.loop.optim import current_learning_rate
from ace3.runtime.loop.run_metrics import RunMetrics, reports_after
from ace3.runtime.loop.run_summary import final_metrics, nonfinite_loss_error
from ace3.runtime.loop.step_counts import planned_total_steps, steps_per_epoch
from ace3.runtime.loop.steps import StepRunner
from ace3.runtime.loop.view import RunPlace
from ace3.runtime.observe.log import ENGINE, METRICS
from ace3.runtime.observe.memory_meter import PeakMemoryMeter, max_over_ranks, memory_summary
from ace3.runtime.observe.reporting import EventWriter
from ace3.runtime.process.distributed import DistContext


class TrainingLoop:
    """Runs one job attempt on this rank (every rank runs the same sequence of collectives).
    Its extensions get it as a :class:`ace3.runtime.loop.view.LoopView`."""

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
        self.config, self.state = parts.config, parts.state
        self.hooks = hooks or HookList()
        self.events = events or EventWriter(place.output_dir / "events.jsonl", enabled=ctx.is_main)
        self.memory, self.strategy, self.extensions = memory, parts.strategy, parts.extensions
        # Every rank of a data replica (its stages and tensor shards) reads the same batches.
        data_rank, data_world = self.strategy.dims.replica
        self.counts_samples = self.strategy.dims.counts_samples
        self.steps = StepRunner(parts, ctx, parts.config)
        self.plan = parts.batch_plan or AccumulationPlan(self.config.gradient_accumulation_steps)
        self.train_data = parts.train_data  # (indexed or streamed: ace3.runtime.data.train_source)
        self.batches_per_epoch = parts.train_data.batches_per_epoch
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
        self.saver = CheckpointSaver(self, parts, place.checkpoint_dir, place.keep_checkpoints)
        self.stop_requested = False
        self.step_lr: float | None = None  # the learning rate of the last optimizer step
        self.run_metrics = RunMetrics(ctx, self.strategy.dims.dp)
        parts.model.stop_training = False

    # -- reporting --------------------------------------------------------------------------
    def log(self, message: str, channel: logging.Logger = ENGINE) -> None:
        if self.ctx.is_main:  # (METRICS: the metric echo and progress lines)
            channel.info(message)

    # -- the view's figures and operations (ace3.runtime.loop.view.LoopView) --------------------
    @property
    def micro_batch_split(self) -> int:
        return self.steps.split

    @property
    def last_step_skipped(self) -> bool:
        return self.steps.last_step_skipped

    def checkpoint_name(self, step: int) -> str:
        return self.strategy.checkpoints.name(step)

    def keep_in_checkpoint(self, key: str, value: list[float]) -> None:
        self.state.carry[key] = value

    def save_checkpoint_now(self) -> None:
        if self.last_saved_step != self.state.step:
            self._save()  # a collective; it also carries the metric windows into the file

    def finish_saves(self) -> None:
        self.saver.close()

    def validation_at_step(self) -> dict[str, float]:
        if self.validated_step == self.state.step:
            return {k: v for k, v in self.state.last_metrics.items() if k.startswith("val_")}
        values = self.evaluate_model()
        if values:
            self._metrics(values)
            self.validated_step = self.state.step
        return values

    def roll_back_to(self, path: Path, lr_scale: float) -> None:
        restored = rolled_back_state(self.parts, path, lr_scale)
        state = self.state  # the same object everywhere (parts.state, the loop's locals): updated
        for entry in fields(state):
            setattr(state, entry.name, getattr(restored, entry.name))
        self.last_saved_step = state.step  # never rewrite the checkpoint it came from
        for window, key in ((self.window, "interval"), (self.epoch_window, "epoch")):
            window.reset()
            window.set_carry(*state.carry.get(key, (0.0, 0.0)))

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for extension in self.extensions:
                stack.enter_context(extension.saving())
            yield

    def report_metrics(self, values: dict[str, float]) -> None:
        self._metrics(values)

    def evaluate_model(self) -> dict[str, float]:
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
        lr = self.step_lr
        lr = lr if lr is not None else current_learning_rate(self.parts.optimizer)
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
        for extension in self.extensions:  # distillation's kd_loss, ... (a collective)
            values.update(extension.training_metrics())
        values.update(self.run_metrics.report(self.steps, self.state))  # grad_norm, per rank
        self._metrics(values)
        speed = f" samples/s={samples_per_sec:.0f}" if samples_per_sec is not None else ""
        step, epoch = self.state.step, self.state.display_epoch()
        self.log(
            f"step {step} epoch {epoch} train_loss={train_loss:.5f} lr={lr:.3g}{speed}", METRICS
        )
        if report.nonfinite is not None:
            self._stop_on_nonfinite_loss(report.nonfinite)
        self.window.reset()

    def _stop_on_nonfinite_loss(self, found: NonFiniteLoss) -> None:
        """Stop every rank (each one calls this at the same reduction: none is left waiting)."""
        error = nonfinite_loss_error(found, self.state, self.events)
        self.log(f"stopping at step {self.state.step}: {error}")
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
            self.log(f"{label}: " + " ".join(f"{k}={v:.5f}" for k, v in values.items()), METRICS)
            if self.parts.scheduler is not None:
                self.parts.scheduler.after_validation(values)
        for extension in self.extensions:  # (eval_prompts' samples)
            extension.after_validation(self)
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
        self.run_metrics.bank_tokens(self.steps, self.state)
        self.saver.save()  # records it, prunes, calls on_checkpoint (async: once written)
        self.last_saved_step = self.state.step

    def save_model(self, path: Path, weights_only: bool) -> None:
        """For hooks (ModelCheckpoint): the full training checkpoint, or the weights alone, at
        ``path`` (written by rank 0; every rank must call this at the same point)."""
        with self.saving():
            self.strategy.checkpoints.save_model_file(self.parts, path, weights_only)

    def done(self) -> bool:
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
            self.log(f"stopping at step {self.state.step}: a callback asked to stop training")
        self.stop_requested = self.stop_requested or wanted
        return wanted

    # -- training ---------------------------------------------------------------------------
    def _train_part(self) -> bool:
        """Train the rest of the current epoch, or until max_steps or a stop request; True:
        rolled back by the instability guard (the caller trains on from the restored place)."""
        state, parts, config = self.state, self.parts, self.config
        batches = self.train_data.batches(
            state.epoch, state.batch_in_epoch, state.data_position, parts.collate_fn
        )
        state.data_position = None  # (loaded: a streamed dataset's resume position)
        hooks, plan = self.hooks, self.plan
        while state.batch_in_epoch < self.batches_per_epoch and not self.done():
            group = min(plan.batches_per_step(), self.batches_per_epoch - state.batch_in_epoch)
            self.steps.lr_factor = plan.lr_factor  # batch-size growth's (1.0 without it)
            batch_index = plan.batch_index(state.batch_in_epoch)
            hooks.on_batch_begin(batch_index)
            self.step_lr = (  # the rate this step uses
                current_learning_rate(parts.optimizer) * plan.lr_factor * state.lr_scale
            )
            waited = time.perf_counter()  # (how long the rank waits for its data: a metric)
            taken = plan.combine([next(batches) for _ in range(group)])
            self.run_metrics.data_wait += time.perf_counter() - waited
            measure = reports_after(state, config, self.batches_per_epoch, group)
            step_loss, samples = self.steps.run(taken, state.step, measure)
            if (reaction := react(self, self.steps.guard)) is not None:  # an unstable step
                for extension in self.extensions:
                    extension.on_instability(self, reaction.reason)
                if reaction.rolled_back:
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
            logs: dict[str, Any] = {}
            if hooks.wants_batch_logs:
                logs = {"loss": float(step_loss.item()), "step": float(state.step),
                        "learning_rate": self.step_lr, "batch_size": float(samples)}  # fmt: skip
            hooks.on_batch_end(batch_index, logs)
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
        state, config, parts = self.state, self.config, self.parts
        epochs = self.train_data.epochs
        # (max_steps may end the run before its epochs do: "3 epoch(s)" read as a promise)
        span = f"{epochs} epoch(s)"
        if config.max_steps is not None:
            span = f"at most {epochs} epoch(s) and max_steps={config.max_steps} steps"
        self.log(
            f"{self.place.label}: {self.train_data.describe()}, "
            f"{self.batches_per_epoch} micro-batches of {parts.per_rank_batch} per rank "
            f"per epoch, {span}, precision {parts.precision.describe()}"
        )
        batches, accumulation = self.batches_per_epoch, config.gradient_accumulation_steps
        self.events.start(
            total_steps=planned_total_steps(batches, accumulation, epochs, config.max_steps, state),
            steps_per_epoch=steps_per_epoch(batches, accumulation), epochs=epochs,
            world_size=self.ctx.world_size, resumed_from_step=state.step if self.place.resumed else 0,
        )  # fmt: skip
        self.hooks.bind(RunContext(
            model=parts.model, optimizer=parts.optimizer, config=config, rank=self.ctx.rank,
            world_size=self.ctx.world_size, device=self.ctx.device,
            output_dir=self.place.output_dir, save_model=self.save_model,
            scheduler=parts.scheduler.scheduler if parts.scheduler is not None else None,
            example_batch=example_batch(self.train_data, parts.collate_fn, self.ctx.device)
            if self.hooks else None,
        ))  # fmt: skip
        validated_at: int | None = None
        try:
            self.hooks.on_train_begin()
            check_rollback_place(self.steps.guard, self.place.checkpoint_dir)
            for extension in self.extensions:
                extension.start(self)
            while state.epoch < epochs and not self.done():
                self.hooks.on_epoch_begin(state.epoch + 1)
                while self._train_part():  # the rest of the epoch (again after a rollback)
                    pass
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

    def _summary(self, extras: dict[str, Any] | None = None) -> dict[str, Any]:
        self.run_metrics.bank_tokens(self.steps, self.state)  # (every rank, as the memory's)
        state, memory = self.state, None
        if self.memory is not None:  # peak memory (the largest rank's), the state's size
            reading = max_over_ranks(self.memory.reading(), self.ctx.device)
            memory = memory_summary(reading, self.strategy.state_bytes(self.parts))
        final = final_metrics(state, self.parts.scaler, self.steps.split, memory, extras)
        self.events.summary(final, state.best_val_accuracy, state.step, state.display_epoch())
        self.log("done: " + " ".join(f"{k}={v}" for k, v in final.items()), METRICS)
        return final
