"""Which NVIDIA device nodes a job of this worker may open.

A worker that shares a machine with others is given its GPUs by ``CUDA_VISIBLE_DEVICES``
(indices or ``GPU-<uuid>`` values). A CUDA index depends on the device order, while a device
node ``/dev/nvidia<minor>`` is numbered by the driver, so both are resolved through the driver's
own table (``/proc/driver/nvidia/gpus/<pci bus id>/information``: ``Device Minor`` and
``GPU UUID``), with indices read in PCI bus order (the job runs with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, as ``nvidia-smi`` numbers them). MIG slices (``MIG-...``) are
not resolved: such a worker's jobs get every GPU node and ``/dev/nvidia-caps`` (docs/security.md).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

GPU_CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
)
MIG_CAPABILITIES = "/dev/nvidia-caps"
DRIVER_TABLE = Path("/proc/driver/nvidia/gpus")


@dataclass(frozen=True)
class DriverGpu:
    bus_id: str
    uuid: str
    minor: int


class GpuSelectionError(ValueError):
    """The worker's CUDA_VISIBLE_DEVICES names a GPU this machine does not have."""


def driver_gpus(table: Path = DRIVER_TABLE) -> list[DriverGpu]:
    """The driver's GPUs in PCI bus order (empty where the driver table is absent)."""
    gpus = []
    try:
        entries = sorted(os.listdir(table))
    except OSError:
        return []
    for bus_id in entries:
        fields: dict[str, str] = {}
        try:
            for line in (table / bus_id / "information").read_text(errors="replace").splitlines():
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
            gpus.append(DriverGpu(bus_id, fields.get("GPU UUID", ""), int(fields["Device Minor"])))
        except (OSError, KeyError, ValueError):
            logger.warning("unreadable NVIDIA driver entry %s; skipped", bus_id)
    return gpus


def gpu_device_nodes(
    visible_devices: str | None, dev: Path = Path("/dev"), table: Path = DRIVER_TABLE
) -> tuple[str, ...]:
    """The control nodes and the device nodes of the GPUs named by ``visible_devices`` (all
    GPUs when it is unset or names MIG slices)."""
    controls = [node for node in GPU_CONTROL_NODES if (dev / Path(node).name).exists()]
    present = sorted(
        int(name.removeprefix("nvidia"))
        for name in _listdir(dev)
        if name.startswith("nvidia") and name.removeprefix("nvidia").isdigit()
    )
    parts = [part.strip() for part in (visible_devices or "").split(",") if part.strip()]
    if not parts or any(part.startswith("MIG-") for part in parts):
        if parts:
            logger.warning("CUDA_VISIBLE_DEVICES names MIG slices: jobs get every GPU node")
        caps = [str(dev / "nvidia-caps")] if (dev / "nvidia-caps").exists() else []
        return tuple(
            [str(dev / Path(n).name) for n in controls]
            + caps
            + [str(dev / f"nvidia{minor}") for minor in present]
        )
    gpus = driver_gpus(table)
    minors = []
    for part in parts:
        minors.append(_minor_of(part, gpus, present))
    return tuple(
        [str(dev / Path(n).name) for n in controls]
        + [str(dev / f"nvidia{minor}") for minor in sorted(set(minors))]
    )


def _minor_of(part: str, gpus: list[DriverGpu], present: list[int]) -> int:
    if part.isdigit():
        index = int(part)
        if gpus:
            if index >= len(gpus):
                raise GpuSelectionError(f"CUDA_VISIBLE_DEVICES: no GPU {index} on this machine")
            return gpus[index].minor
        if index not in present:  # (no driver table: indices are taken as node numbers)
            raise GpuSelectionError(f"CUDA_VISIBLE_DEVICES: no /dev/nvidia{index}")
        return index
    for gpu in gpus:
        if gpu.uuid and (gpu.uuid == part or gpu.uuid.startswith(part)):
            return gpu.minor
    raise GpuSelectionError(f"CUDA_VISIBLE_DEVICES: no GPU {part!r} on this machine")


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
