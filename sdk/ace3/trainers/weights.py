"""``init_from`` on the SDK side: a local checkpoint file becomes uploaded weights for a remote
job (a ``.pt`` checkpoint is read without running pickled code and converted to safetensors
first), and a stored checkpoint id becomes a local file for an in-process run."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ace3.config import TrainingConfig

if TYPE_CHECKING:
    from ace3.client import Client


def local_weights_file(config: TrainingConfig) -> Path:
    """``config.init_from`` as an existing file (FileNotFoundError naming it otherwise)."""
    assert config.init_from is not None
    path = Path(config.init_from).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"init_from: no checkpoint file at {path}")
    return path


def as_safetensors(path: Path, scratch: Path) -> Path:
    """``path`` itself when it is a ``.safetensors`` file; otherwise its model weights (read
    weights-only) written as one in ``scratch``."""
    if path.suffix.lower() == ".safetensors":
        return path
    from safetensors.torch import save_file

    from ace3.runtime.techniques.initial_weights import read_weights

    weights = {name: value.contiguous() for name, value in read_weights(path).items()}
    target = scratch / f"{path.stem}.safetensors"
    save_file(weights, str(target), metadata={"source": path.name[:200]})
    return target


def upload_local_weights(config: TrainingConfig, client: Client) -> TrainingConfig:
    """``config`` whose local ``init_from`` file is uploaded and named by its id."""
    if config.init_from is None:
        return config
    path = local_weights_file(config)
    with tempfile.TemporaryDirectory(prefix="ace3-weights-") as scratch:
        uploaded = client.checkpoints.upload(as_safetensors(path, Path(scratch)), name=path.name)
    return config.model_copy(update={"init_from": None, "init_from_checkpoint_id": uploaded.id})


@contextmanager
def weights_for_local_run(config: TrainingConfig, client: Client | None) -> Iterator[Path | None]:
    """The file an in-process run starts from: ``init_from`` itself, or the stored checkpoint
    ``init_from_checkpoint_id`` downloaded (with ``client``, or the default client) for the
    duration of the run."""
    if config.init_from is not None:
        yield local_weights_file(config)
        return
    if config.init_from_checkpoint_id is None:
        yield None
        return
    if client is None:
        from ace3.client import get_default_client

        client = get_default_client()
    with tempfile.TemporaryDirectory(prefix="ace3-init-") as scratch:
        yield client.checkpoints.download(config.init_from_checkpoint_id, Path(scratch))
