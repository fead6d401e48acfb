"""The training loop: DDP micro-steps with gradient accumulation, metrics, validation, saves.

One optimizer step consumes ``gradient_accumulation_steps`` per-rank micro-batches (fewer for
the last group of an epoch); the loss of each is divided by the group's size, and gradients are
synchronised only on the group's last micro-batch. Training metrics go out at step 1 and every
``log_interval`` steps; after every epoch, its mean loss (``epoch_train_loss``) with the
validation metrics; checkpoints every ``save_interval`` steps and at the end; a summary last.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ace3.runtime.build import Components
from ace3.runtime.distributed import DistContext
from ace3.runtime.evaluation import evaluate
from ace3.runtime.job_spec import JobSpec
from ace3.runtime.loaders import batches_per_epoch, train_loader, train_sampler, validation_loader
from ace3.runtime.losses import batch_size_of, forward_loss, move_to_device
from ace3.runtime.metric_window import MetricWindow
from ace3.runtime.optim import current_learning_rate
from ace3.runtime.reporting import EventWriter
from ace3.runtime.rng import rank_seed
from ace3.runtime.saving import save_job_checkpoint


class Trainer:
    """Runs one job attempt on this rank (every rank runs the same sequence of collectives)."""

    def __init__(self, job: JobSpec, ctx: DistContext, parts: Components) -> None:
        self.job, self.ctx, self.parts = job, ctx, parts
        self.config = job.config
        self.state = parts.state
        self.checkpoint_dir = Path(job.output_dir) / "checkpoints"
        self.events = EventWriter(Path(job.output_dir) / "events.jsonl", enabled=ctx.is_main)
        self.sampler = train_sampler(parts.train_set, ctx.rank, ctx.world_size, self.config.seed)
        self.batches_per_epoch = batches_per_epoch(self.sampler, parts.per_rank_batch)
        pin = ctx.device.type == "cuda"
        self.val_loader = None
        if parts.validation_set is not None:
            self.val_loader = validation_loader(
                parts.validation_set, ctx.rank, ctx.world_size, parts.per_rank_batch,
                self.config.num_workers, pin_memory=pin,
            )  # fmt: skip
        self.window = MetricWindow(ctx.device, ctx.rank)  # since the last metrics event
        self.epoch_window = MetricWindow(ctx.device, ctx.rank)  # since the epoch began
        self.window.set_carry(*self.state.carry.get("interval", (0.0, 0.0)))
        self.epoch_window.set_carry(*self.state.carry.get("epoch", (0.0, 0.0)))
        # A resumed run never rewrites the checkpoint it started from.
        self.last_saved_step: int | None = self.state.step if job.resume_from else None
        self.save_after_validation = False

    # -- reporting --------------------------------------------------------------------------
    def _log(self, message: str) -> None:
        if self.ctx.is_main:
            print(message, flush=True)

    def _metrics(self, values: dict[str, float]) -> None:
        self.state.record(values)
        self.events.metrics(self.state.step, self.state.display_epoch(), values)

    def _report_window(self) -> None:
        train_loss, samples_per_sec = self.window.reduce(self.ctx.world_size)
        lr = current_learning_rate(self.parts.optimizer)
        values = {
            "train_loss": train_loss,
            "learning_rate": lr,
            "epoch": float(self.state.display_epoch()),
        }
        if samples_per_sec is not None:
            values["samples_per_sec"] = samples_per_sec
        self._metrics(values)
        speed = f" samples/s={samples_per_sec:.0f}" if samples_per_sec is not None else ""
        self._log(
            f"step {self.state.step} epoch {self.state.display_epoch()} "
            f"train_loss={train_loss:.5f} lr={lr:.3g}{speed}"
        )
        self.window.reset()

    def _validate(self, label: str, with_epoch_loss: bool) -> None:
        values: dict[str, float] = {}
        if with_epoch_loss and self.epoch_window.has_data:
            # Not "train_loss": metrics are keyed by (step, name), and an interval report can
            # share this step.
            values["epoch_train_loss"], _ = self.epoch_window.reduce(self.ctx.world_size)
        if self.val_loader is not None:
            parts = self.parts
            if self.ctx.world_size > 1:
                # Every rank validates with rank 0's buffers (BatchNorm statistics): the ones the
                # checkpoint holds. DDP only syncs them at the next forward pass.
                for buffer in parts.model.buffers():
                    dist.broadcast(buffer, src=0)
            values.update(
                evaluate(parts.model, self.val_loader, self.ctx.device, parts.precision, parts.user)
            )
        if values:
            self._metrics(values)
            self._log(f"{label}: " + " ".join(f"{k}={v:.5f}" for k, v in values.items()))

    def _save(self) -> None:
        interval = self.window.global_sums(self.ctx.world_size)
        epoch = self.epoch_window.global_sums(self.ctx.world_size)
        self.state.carry = {"interval": list(interval[:2]), "epoch": list(epoch[:2])}
        save_job_checkpoint(self.parts, self.ctx, self.checkpoint_dir, self.events)
        self.last_saved_step = self.state.step

    def _done(self) -> bool:
        max_steps = self.config.max_steps
        return max_steps is not None and self.state.step >= max_steps

    # -- training ---------------------------------------------------------------------------
    def _optimizer_step(self, micro_batches: list[Any]) -> tuple[torch.Tensor, int]:
        parts, config = self.parts, self.config
        parts.optimizer.zero_grad(set_to_none=True)
        group = len(micro_batches)
        step_loss = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        samples = 0
        for i, raw in enumerate(micro_batches):
            batch = move_to_device(raw, self.ctx.device)
            samples += batch_size_of(batch)
            sync = contextlib.nullcontext() if i == group - 1 else parts.ddp.no_sync()
            with sync:
                with parts.precision.autocast():
                    loss = forward_loss(parts.ddp, batch, parts.user.compute_loss).loss
                parts.scaler.scale(loss / group).backward()
            step_loss += loss.detach().float() / group
        if config.max_grad_norm is not None:
            parts.scaler.unscale_(parts.optimizer)
            torch.nn.utils.clip_grad_norm_(parts.model.parameters(), config.max_grad_norm)
        parts.scaler.step(parts.optimizer)
        parts.scaler.update()
        return step_loss, samples

    def _train_epoch(self) -> None:
        """Train the rest of the current epoch, or until max_steps."""
        state, parts, config = self.state, self.parts, self.config
        self.sampler.set_epoch(state.epoch)
        loader = train_loader(
            parts.train_set, self.sampler, parts.per_rank_batch, state.batch_in_epoch,
            config.num_workers, rank_seed(config.seed + state.epoch, self.ctx.rank),
            pin_memory=self.ctx.device.type == "cuda",
        )  # fmt: skip
        batches = iter(loader)
        k = config.gradient_accumulation_steps
        while state.batch_in_epoch < self.batches_per_epoch and not self._done():
            group = min(k, self.batches_per_epoch - state.batch_in_epoch)
            step_loss, samples = self._optimizer_step([next(batches) for _ in range(group)])
            state.step += 1
            state.batch_in_epoch += group
            self.window.add(step_loss, samples)
            self.epoch_window.add(step_loss, samples)
            if state.step == 1 or state.step % config.log_interval == 0:
                self._report_window()
            if config.save_interval and state.step % config.save_interval == 0:
                if state.batch_in_epoch >= self.batches_per_epoch:
                    self.save_after_validation = True  # so it holds this epoch's validation
                else:
                    self._save()

    def run(self) -> dict[str, Any]:
        """Train to the end; write the final checkpoint and the summary; return final metrics."""
        state, config = self.state, self.config
        self._log(
            f"job {self.job.job_id} attempt {self.job.attempt}: "
            f"{len(self.sampler.dataset)} training samples, "  # type: ignore[arg-type]
            f"{self.batches_per_epoch} micro-batches of {self.parts.per_rank_batch} per rank "
            f"per epoch, {config.epochs} epoch(s), precision {self.parts.precision.describe()}"
        )
        validated_at: int | None = None
        try:
            while state.epoch < config.epochs and not self._done():
                self._train_epoch()
                if state.batch_in_epoch < self.batches_per_epoch:
                    break  # stopped by max_steps mid-epoch
                if self.window.has_data:
                    self._report_window()  # the epoch's last steps, before its validation
                self._validate(f"epoch {state.epoch + 1} done", with_epoch_loss=True)
                validated_at = state.step
                if self.save_after_validation:
                    self.save_after_validation = False
                    self._save()
                state.epoch += 1
                state.batch_in_epoch = 0
                self.epoch_window.reset()
            if self.window.has_data:
                self._report_window()
            if validated_at != state.step and self.val_loader is not None:
                self._validate(f"validation at step {state.step}", with_epoch_loss=False)
            if self.last_saved_step != state.step:
                self._save()
            return self._summary()
        finally:
            self.events.close()

    def _summary(self) -> dict[str, Any]:
        state = self.state
        final: dict[str, Any] = {
            key: value
            for key, value in state.last_metrics.items()
            if key == "train_loss" or key.startswith("val_")
        }
        if state.best_val_accuracy is not None:
            final["best_val_accuracy"] = state.best_val_accuracy
        final["steps"] = state.step
        final["epochs"] = state.display_epoch()
        self.events.write(
            {
                "type": "summary",
                "final_metrics": final,
                "best_val_accuracy": state.best_val_accuracy,
                "steps": state.step,
                "epochs": state.display_epoch(),
            }
        )
        self._log("done: " + " ".join(f"{k}={v}" for k, v in final.items()))
        return final
