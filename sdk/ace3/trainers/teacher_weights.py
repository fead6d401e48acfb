"""A distillation teacher's weights on the SDK side, as ``init_from``'s are
(:mod:`ace3.trainers.weights`): a local file becomes uploaded weights for a remote job (a
``.pt`` checkpoint read without running pickled code and converted to safetensors), and a
stored checkpoint id becomes a local file for an in-process run."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ace3.config import TrainingConfig
from ace3.trainers.weights import as_safetensors

if TYPE_CHECKING:
    from ace3.client import Client


def _with_teacher(config: TrainingConfig, **fields: object) -> TrainingConfig:
    assert config.distillation is not None
    settings = config.distillation.model_copy(update=fields)
    return config.model_copy(update={"distillation": settings})


def upload_teacher_weights(config: TrainingConfig, client: Client) -> TrainingConfig:
    """``config`` whose local ``teacher_checkpoint`` file is uploaded and named by its id."""
    settings = config.distillation
    if settings is None or settings.teacher_checkpoint_path is None:
        return config
    path = Path(settings.teacher_checkpoint_path).expanduser()
    with tempfile.TemporaryDirectory(prefix="ace3-teacher-") as scratch:
        uploaded = client.checkpoints.upload(as_safetensors(path, Path(scratch)), name=path.name)
    return _with_teacher(config, teacher_checkpoint_path=None, teacher_checkpoint_id=uploaded.id)


@contextmanager
def teacher_weights_for_local_run(
    config: TrainingConfig, client: Client | None
) -> Iterator[TrainingConfig]:
    """``config`` for an in-process run: a stored ``teacher_checkpoint_id`` downloaded (with
    ``client``, or the default client) to a local file for the duration of the run."""
    settings = config.distillation
    if settings is None or settings.teacher_checkpoint_id is None:
        yield config
        return
    if client is None:
        from ace3.client import get_default_client

        client = get_default_client()
    with tempfile.TemporaryDirectory(prefix="ace3-teacher-") as scratch:
        path = client.checkpoints.download(settings.teacher_checkpoint_id, Path(scratch))
        yield _with_teacher(config, teacher_checkpoint_id=None, teacher_checkpoint_path=str(path))
