"""Write one checkpoint for the whole job: gather RNG states, let the strategy write its
format, report it, barrier.

Every rank must call :func:`save_job_checkpoint` at the same step (it runs collectives). The
file is ``step-XXXXXXXX.pt`` (the plain format: :mod:`ace3.runtime.checkpoint.plain`, or
gathered from a split model: :mod:`ace3.runtime.checkpoint.gathered`) or, for ZeRO jobs,
``step-XXXXXXXX.dcp.tar`` (every rank writes its shards, rank 0 packs them:
:mod:`ace3.runtime.checkpoint.sharded`); the event is the same.
"""

from __future__ import annotations

from pathlib import Path

from ace3.config.events import CheckpointRecord, finite_or_none
from ace3.runtime.checkpoint.files import SavedCheckpoint
from ace3.runtime.checkpoint.plain import gather_rng
from ace3.runtime.components import Components
from ace3.runtime.distributed import DistContext, barrier
from ace3.runtime.reporting import EventWriter


def save_job_checkpoint(
    parts: Components, ctx: DistContext, directory: Path, events: EventWriter
) -> SavedCheckpoint | None:
    """Save the checkpoint of the current step atomically into ``directory`` and append its
    checkpoint event (rank 0)."""
    gathered = gather_rng(ctx)
    state, strategy = parts.state, parts.strategy
    saved = strategy.save_checkpoint(
        parts, directory / strategy.checkpoint_name(state.step), gathered
    )
    if saved is not None:
        events.emit(
            CheckpointRecord,
            step=state.step,
            epoch=state.display_epoch(),
            name=saved.path.name,
            path=str(saved.path),
            sha256=saved.sha256,
            size_bytes=saved.size_bytes,
            metrics=finite_or_none(dict(state.last_metrics)),
        )
        print(
            f"checkpoint {saved.path.name} saved "
            f"({saved.size_bytes} bytes, sha256 {saved.sha256[:12]})"
        )
    barrier(ctx)
    return saved
