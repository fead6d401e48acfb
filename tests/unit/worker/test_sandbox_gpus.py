"""A worker's CUDA_VISIBLE_DEVICES becomes exactly those GPUs' device nodes, resolved through
the driver's table (its minor numbers need not follow the CUDA order)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ace3_worker.sandbox.gpus import GpuSelectionError, driver_gpus, gpu_device_nodes

# Two GPUs whose device minors run against their PCI order (as on some multi-socket hosts).
DRIVER = {
    "0000:17:00.0": ("GPU-aaaa1111-0000-0000-0000-000000000000", 1),
    "0000:65:00.0": ("GPU-bbbb2222-0000-0000-0000-000000000000", 0),
}


@pytest.fixture
def machine(tmp_path: Path) -> tuple[Path, Path]:
    dev, table = tmp_path / "dev", tmp_path / "gpus"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1", "null"):
        (dev / name).touch()
    (dev / "nvidia-caps").mkdir()
    for bus_id, (uuid, minor) in DRIVER.items():
        (table / bus_id).mkdir(parents=True)
        (table / bus_id / "information").write_text(
            f"Model: \t\t NVIDIA H100\nIRQ:   \t\t 42\nGPU UUID: \t {uuid}\n"
            f"Device Minor: \t {minor}\nBus Location: \t {bus_id}\n"
        )
    return dev, table


def test_the_driver_table_is_read_in_pci_order(machine: tuple[Path, Path]) -> None:
    _, table = machine
    assert [(g.bus_id, g.minor) for g in driver_gpus(table)] == [
        ("0000:17:00.0", 1),
        ("0000:65:00.0", 0),
    ]


@pytest.mark.parametrize(
    ("visible", "gpus"),
    [
        ("0", ["nvidia1"]),  # the first GPU in PCI order has minor 1
        ("1", ["nvidia0"]),
        ("GPU-bbbb2222", ["nvidia0"]),
        ("GPU-aaaa1111-0000-0000-0000-000000000000,1", ["nvidia0", "nvidia1"]),
    ],
)
def test_only_the_named_gpus_are_bound_and_never_the_mig_capabilities(
    machine: tuple[Path, Path], visible: str, gpus: list[str]
) -> None:
    dev, table = machine
    nodes = gpu_device_nodes(visible, dev=dev, table=table)
    assert nodes == (str(dev / "nvidiactl"), str(dev / "nvidia-uvm"), *(str(dev / g) for g in gpus))


@pytest.mark.parametrize("visible", [None, "", "MIG-0b1c2d3e"])
def test_a_worker_without_a_selection_or_with_mig_slices_binds_every_gpu(
    machine: tuple[Path, Path], visible: str | None
) -> None:
    dev, table = machine
    nodes = gpu_device_nodes(visible, dev=dev, table=table)
    assert set(nodes) >= {str(dev / "nvidia0"), str(dev / "nvidia1"), str(dev / "nvidia-caps")}


@pytest.mark.parametrize("visible", ["2", "GPU-cccc"])
def test_a_gpu_the_machine_lacks_is_a_clear_error(machine: tuple[Path, Path], visible: str) -> None:
    dev, table = machine
    with pytest.raises(GpuSelectionError, match="CUDA_VISIBLE_DEVICES"):
        gpu_device_nodes(visible, dev=dev, table=table)


def test_without_a_driver_table_indices_are_node_numbers(machine: tuple[Path, Path]) -> None:
    dev, _ = machine
    nodes = gpu_device_nodes("1", dev=dev, table=dev / "absent")
    assert nodes[-1] == str(dev / "nvidia1") and str(dev / "nvidia0") not in nodes
