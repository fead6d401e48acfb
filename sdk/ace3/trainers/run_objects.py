"""What a run needs of its trainer: the objects the user gave it, taken once, read-only.

:meth:`ace3.Trainer.train` builds a :class:`TrainerObjects` and hands it, with the resolved
config, to :func:`ace3.trainers.in_process.run_locally` or to
:mod:`ace3.trainers.remote`'s ``submit_job`` / ``follow_job``; neither sees the trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ace3.client import Client
    from ace3.config import CheckpointConfig
    from ace3.training.callbacks.base import Callback
    from ace3.training.loggers.base import Logger


@dataclass(frozen=True)
class TrainerObjects:
    """The trainer's objects a run reads: the client (None: the default one), callbacks,
    loggers, the local checkpoint directory and what ``load_checkpoint`` was given."""

    client: Client | None
    callbacks: tuple[Callback, ...]
    loggers: tuple[Logger, ...]
    #: ``CheckpointConfig.save_dir``, else the first logger's checkpoint directory, else None
    checkpoint_dir: Path | None
    #: a local checkpoint file or a stored checkpoint's id (``Trainer.load_checkpoint``)
    resume_source: str | None

    @classmethod
    def of(
        cls,
        *,
        client: Client | None,
        callbacks: Sequence[Callback],
        loggers: Sequence[Logger],
        checkpoint_config: CheckpointConfig | None,
        resume_source: str | None,
    ) -> TrainerObjects:
        return cls(
            client=client,
            callbacks=tuple(callbacks),
            loggers=tuple(loggers),
            checkpoint_dir=_checkpoint_dir(checkpoint_config, loggers),
            resume_source=resume_source,
        )


def _checkpoint_dir(
    checkpoint_config: CheckpointConfig | None, loggers: Sequence[Logger]
) -> Path | None:
    if checkpoint_config is not None and checkpoint_config.save_dir:
        return Path(checkpoint_config.save_dir).expanduser().resolve()
    for logger in loggers:
        directory = logger.checkpoint_dir() if hasattr(logger, "checkpoint_dir") else None
        if directory is not None:
            return Path(directory).expanduser().resolve()
    return None
