"""The job's parallel layout: data x pipeline x tensor degrees over one ``DeviceMesh``.

``world_size = dp * pp * tp``. Ranks are laid out row-major over the mesh dimensions
``("dp", "pp", "tp")``: tensor-parallel peers are consecutive ranks (the same machine, where
the links are fastest), the stages of one pipeline come next, and data-parallel replicas are
the outermost dimension. So rank ``r`` is tensor rank ``r % tp``, stage ``(r // tp) % pp`` and
replica ``r // (tp * pp)``.

Every rank of one replica (its stages and tensor shards) reads the same batches; replicas read
disjoint slices of each global batch (see :attr:`ParallelDims.replica`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from ace3.config import TrainingConfig, parallel_degrees

MESH_NAMES = ("dp", "pp", "tp")


@dataclass
class ParallelDims:
    """The degrees of one job and this rank's coordinates in them."""

    dp: int
    pp: int
    tp: int
    rank: int
    _mesh: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in MESH_NAMES:
            if getattr(self, name) < 1:
                raise ValueError(f"parallel degree {name} must be at least 1")

    @classmethod
    def for_job(cls, config: TrainingConfig, world_size: int, rank: int) -> ParallelDims:
        """The layout ``config`` asks for on ``world_size`` processes (the degrees left out
        of the config take what remains: data parallelism by default)."""
        pp, tp = parallel_degrees(config, world_size)
        if world_size % (pp * tp):
            raise ValueError(
                f"pipeline_parallel_size ({pp}) x tensor_parallel_size ({tp}) must divide the "
                f"{world_size} processes of this job (num_gpus * num_nodes): the data-parallel "
                "degree is what remains"
            )
        return cls(dp=world_size // (pp * tp), pp=pp, tp=tp, rank=rank)

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def pp_rank(self) -> int:
        return (self.rank // self.tp) % self.pp

    @property
    def dp_rank(self) -> int:
        return self.rank // (self.tp * self.pp)

    @property
    def replica(self) -> tuple[int, int]:
        """(this rank's data replica, how many there are): what the loaders shard by."""
        return self.dp_rank, self.dp

    @property
    def counts_samples(self) -> bool:
        """One rank per replica counts the samples it trained on (throughput)."""
        return self.tp_rank == 0 and self.pp_rank == 0

    def global_rank(self, dp: int, pp: int, tp: int) -> int:
        return (dp * self.pp + pp) * self.tp + tp

    def describe(self) -> str:
        parts = [f"data {self.dp}"]  # e.g. "data 2 x pipeline 2 = 4 process(es)"
        if self.pp > 1:
            parts.append(f"pipeline {self.pp}")
        if self.tp > 1:
            parts.append(f"tensor {self.tp}")
        return " x ".join(parts) + f" = {self.world_size} process(es)"

    # -- the mesh -------------------------------------------------------------------------------
    def mesh(self, device_type: str) -> Any:
        """The job's ``DeviceMesh`` of shape ``(dp, pp, tp)``, built once (a collective the
        first time: every rank must ask for it at the same point)."""
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(
                device_type, (self.dp, self.pp, self.tp), mesh_dim_names=MESH_NAMES
            )
        return self._mesh

    def submesh(self, device_type: str, name: str) -> Any:
        """The 1-D mesh of this rank's peers along ``name`` (``dp``, ``pp`` or ``tp``)."""
        return self.mesh(device_type)[name]

    def group(self, device_type: str, name: str) -> Any:
        """The process group of this rank's peers along ``name`` (the default group, without
        building a mesh, when that dimension spans the whole job)."""
        if getattr(self, name) == self.world_size:
            return dist.group.WORLD
        return self.submesh(device_type, name).get_group()
