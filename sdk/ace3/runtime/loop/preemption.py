"""Preemption: on SIGTERM (a spot-instance notice, a worker being drained) every rank finishes
its optimizer step, the ranks agree on the step to stop at, write a checkpoint there and stop
with :class:`ace3.errors.TrainingPreemptedError` (a job's ranks then leave with
``PREEMPTED_EXIT_CODE``: :mod:`ace3.runtime.__main__`). On by default
(``TrainingConfig.checkpoint_on_sigterm``).

The signal only sets a flag (:class:`SigtermNotice`); the loop acts on it at the end of a step
(:meth:`Preemption.step_end`). SIGTERM reaches the ranks at different moments, so they must
agree on the step, without a host sync per step: each step's end issues an *asynchronous*
all-reduce (MAX) of this rank's flag on a CPU (gloo) group of its own, and the next step's end
waits for it (long done by then) and reads the result. Every rank reads the same result at the
same step, so they stop together, one or two steps after the first SIGTERM. The flag never
touches the accelerator (no stream sync on CUDA), and the last step of an epoch is never the
stop (the loop saves that one after its validation): the agreement is read one step later.

``preemption_grace_seconds``: a SIGTERM that is not followed by the stop within the grace
(a stuck step) ends the process with the signal's default action; the service's own SIGKILL
follows the same grace (``ace3_worker.drain``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from ace3.config import TrainingConfig
from ace3.errors import TrainingPreemptedError
from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.loop.view import LoopView
from ace3.runtime.process.distributed import DistContext


class SigtermNotice:
    """Catches SIGTERM in this process while the run is on (only the main thread can install a
    handler); with ``grace``, a timer ends the process that many seconds after the first one."""

    def __init__(self, grace: float | None) -> None:
        self.grace = grace
        self.received_at: float | None = None
        self.acted = False
        self._previous: Any = None
        self._installed = False
        self._timer: threading.Timer | None = None

    @property
    def received(self) -> bool:
        return self.received_at is not None

    def install(self) -> bool:
        """Catch SIGTERM from now on; False outside the main thread (nothing installed)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        self._installed = True
        return True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received_at is not None:
            return  # (torchrun forwards the worker's SIGTERM: the same notice twice)
        self.received_at = time.monotonic()
        if self.grace is not None:
            self._timer = threading.Timer(self.grace, self._grace_over)
            self._timer.daemon = True
            self._timer.start()

    def _grace_over(self) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)

    def restore(self, redeliver: bool) -> None:
        """The previous handler back. With ``redeliver``, a SIGTERM this run caught but did not
        act on (the run ended first) goes to that handler now (an in-process run: the caller's
        process was asked to stop)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._installed:
            return
        self._installed = False
        previous = self._previous if self._previous is not None else signal.SIG_DFL
        signal.signal(signal.SIGTERM, previous)
        if redeliver and self.received and not self.acted:
            if callable(previous):
                previous(signal.SIGTERM, None)
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGTERM)


class Preemption(LoopExtension):
    """Stops the run at an agreed step after a SIGTERM, with a checkpoint (see the module
    docstring). ``in_process``: a live run in the caller's process (a SIGTERM it did not act on
    is passed on to the caller's handler when the run ends)."""

    def __init__(self, config: TrainingConfig, ctx: DistContext, in_process: bool) -> None:
        self.ctx = ctx
        self.in_process = in_process
        self.notice = SigtermNotice(config.preemption_grace_seconds)
        self.group: Any = None
        self.flag = torch.zeros(1)
        self.pending: Any = None  # the all-reduce issued at the end of the previous step

    def start(self, loop: LoopView) -> None:
        if not self.notice.install():
            loop.log(
                "note: checkpoint_on_sigterm: the run is not in the main thread, where a "
                "SIGTERM handler must be installed: SIGTERM is not caught"
            )
        if self.ctx.world_size > 1:  # (every rank, in the same order as any other group)
            self.group = dist.new_group(backend="gloo")

    def step_end(self, loop: LoopView) -> None:
        if loop.state.batch_in_epoch >= loop.batches_per_epoch:
            return  # the epoch's last step: decided at the next one (see the module docstring)
        if loop.done():
            return  # max_steps reached (or a callback stopped it): the run ends now anyway
        if self.ctx.world_size == 1:
            if self.notice.received:
                self._stop(loop)
            return
        if self.pending is not None:
            self.pending.wait()
            self.pending = None
            if self.flag.item() > 0:
                self._stop(loop)
        self.flag.fill_(1.0 if self.notice.received else 0.0)
        self.pending = dist.all_reduce(
            self.flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True
        )

    def _stop(self, loop: LoopView) -> None:
        """Every rank, at the same step: the checkpoint of this step, the record, the error."""
        state = loop.state
        self.notice.acted = True
        loop.log(f"preempted (SIGTERM): stopping after step {state.step} with a checkpoint")
        loop.save_checkpoint_now()  # a collective; it carries the metric windows into the file
        name = None
        if loop.place.checkpoint_dir is not None:
            name = loop.checkpoint_name(state.step)
        loop.events.preempted(state.step, state.display_epoch(), name)
        raise TrainingPreemptedError(state.step, name)

    def finish(self, loop: LoopView) -> dict[str, Any]:
        self._drain()
        return {}

    def close(self) -> None:
        self.notice.restore(redeliver=self.in_process)

    def _drain(self) -> None:
        if self.pending is not None:
            with contextlib.suppress(RuntimeError):
                self.pending.wait()
            self.pending = None
