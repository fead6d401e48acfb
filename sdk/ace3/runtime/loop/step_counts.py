"""How many optimizer steps a run takes: the one formula the schedule, the run's plan (the
``start`` record) and the loop agree on.

An epoch is ``batches_per_epoch`` loader batches of one data replica (a rank of a
data-parallel job; the single replica of a model- or pipeline-parallel job, whose ranks all read
the same batches), run as optimizer steps of ``gradient_accumulation_steps`` batches each, the
last group of the epoch shorter (:class:`ace3.runtime.data.train_source.TrainData` says how
many batches an epoch has, and how many epochs: a cycling stream's run is one epoch of
``max_steps`` steps).
"""

from __future__ import annotations

from ace3.runtime.loop.train_state import TrainState


def steps_per_epoch(batches_per_epoch: int, accumulation: int) -> int:
    """Optimizer steps of a whole epoch: one per ``accumulation`` micro-batches, the last group
    shorter."""
    return -(-batches_per_epoch // accumulation)


def planned_total_steps(
    batches_per_epoch: int,
    accumulation: int,
    epochs: int,
    max_steps: int | None,
    state: TrainState,
) -> int:
    """The optimizer steps the run plans in all, counted from step 0 (a resumed run's earlier
    steps included): an upper bound that ``state.step`` never exceeds.

    It follows :meth:`TrainingLoop._train_part`: an epoch's ``batches_per_epoch`` loader batches
    (of one rank, or of the one data replica of a model- or pipeline-parallel job) run as
    optimizer steps of ``accumulation`` batches each, the last group shorter, so a whole epoch takes ``ceil(batches_per_epoch / accumulation)`` steps. A resumed
    run first finishes its epoch from ``batch_in_epoch``, grouped by the accumulation it runs
    with now (``ceil((batches_per_epoch - batch_in_epoch) / accumulation)``, none when the
    checkpoint closed the epoch or came from a run with more micro-batches per epoch), then runs
    the remaining whole epochs. ``max_steps`` stops the loop once the step reaches it (never
    below the step resumed from). Nothing else adds steps: out-of-memory recovery cuts the same
    loader batches into more micro-batches inside the same optimizer step, and a pipeline step
    takes the same group of batches; a callback's stop or ``max_steps`` only end the run
    sooner. With batch-size growth (accumulation 1, loader batches of ``min_batch_size``) this
    is the bound of a run that never grows: a step takes one loader batch or more.
    """
    remaining = 0
    if state.epoch < epochs:
        rest_of_epoch = max(0, batches_per_epoch - state.batch_in_epoch)
        remaining = steps_per_epoch(rest_of_epoch, accumulation) + (
            epochs - state.epoch - 1
        ) * steps_per_epoch(batches_per_epoch, accumulation)
    total = state.step + remaining
    if max_steps is not None:
        total = min(total, max(max_steps, state.step))
    return total
