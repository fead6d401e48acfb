"""Process-group setup and teardown from torchrun's environment variables.

Backend: ``config.backend='auto'`` means nccl when ``ACE3_DEVICE=cuda`` and CUDA is available,
gloo otherwise. Run without torchrun (no ``RANK`` in the environment), the engine starts a
one-process group of its own so the same code path applies.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ace3.config import TrainingConfig
from ace3.runtime.observe.log import ENGINE, TO_STDERR


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def resolve_device_and_backend(
    config: TrainingConfig, local_rank: int, default_device: str = "cpu"
) -> tuple[torch.device, str]:
    """Pick the device from ``ACE3_DEVICE`` (else ``default_device``), the backend from the
    config."""
    wants_cuda = os.environ.get("ACE3_DEVICE", default_device).strip().lower() == "cuda"
    has_cuda = torch.cuda.is_available()
    if wants_cuda and not has_cuda:
        ENGINE.warning(
            "warning: ACE3_DEVICE=cuda but CUDA is not available; training on CPU", extra=TO_STDERR
        )
    use_cuda = wants_cuda and has_cuda
    backend = config.backend
    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    if backend == "nccl" and not use_cuda:
        raise RuntimeError(
            "backend='nccl' needs CUDA GPUs, but this process has none "
            f"(ACE3_DEVICE={os.environ.get('ACE3_DEVICE', 'unset')!r}, "
            f"torch.cuda.is_available()={has_cuda}); use backend='gloo' or 'auto' on CPU workers"
        )
    if use_cuda:
        # A worker gives each job its own GPUs as CUDA_VISIBLE_DEVICES (ACE3_WORKER_GPUS): CUDA
        # renumbers them 0..N-1 in this process, so local rank i uses the job's i-th GPU.
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA device(s) "
                "are visible (CUDA_VISIBLE_DEVICES="
                f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')!r}): start at most one "
                "process per GPU"
            )
        return torch.device("cuda", local_rank), backend
    return torch.device("cpu"), backend


def init_distributed(config: TrainingConfig, default_device: str = "cpu") -> DistContext:
    """Join (or, outside torchrun, create) the default process group."""
    launched = "RANK" in os.environ
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    device, backend = resolve_device_and_backend(config, local_rank, default_device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        init_method = "env://" if launched else f"tcp://127.0.0.1:{_free_port()}"
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(minutes=30),
            device_id=device if backend == "nccl" else None,
        )
    return DistContext(rank, local_rank, world_size, backend, device)


def barrier(ctx: DistContext) -> None:
    """A barrier of every rank (nccl uses the device bound at init)."""
    if ctx.world_size > 1:
        dist.barrier()


def destroy_distributed() -> None:
    """Tear the default process group down if one exists; safe to call on any path."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
