"""One GPU set per job: ACE3_WORKER_GPUS is validated, the allocator hands out disjoint sets
(across processes, through lock files), a killed holder frees its devices, the advertised
capacity follows the device list, and a job that needs more devices than are free now is handed
back to the queue, not claimed and not held."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from ace3_control.models import Job, utcnow
from ace3_control.settings import Settings
from ace3_server.migrations_check import upgrade
from ace3_worker.device import device_pool, device_pool_problem, local_capacity
from ace3_worker.gpu_sets import DeviceAllocator, DevicesBusyError
from ace3_worker.supervisor import Supervisor
from tests.conftest import insert_job

POOL = ("0", "1", "2", "3")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0,1,2,3", ("0", "1", "2", "3")),
        (" 2, 03 ,GPU-8f2a-11", ("2", "3", "GPU-8f2a-11")),
        ("", None),
    ],
)
def test_the_device_list_is_parsed(value: str, expected: tuple[str, ...] | None) -> None:
    assert Settings(worker_gpus=value).resolved_worker_gpus == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0,,1", "'' is not a GPU index or UUID"),
        ("0,1,01", "GPU 1 is listed more than once"),
        ("cuda:0", "'cuda:0' is not a GPU index or UUID"),
        ("0;1", "'0;1' is not a GPU index or UUID"),
    ],
)
def test_a_bad_device_list_is_refused_naming_the_setting(value: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(worker_gpus=value)
    assert f"ACE3_WORKER_GPUS={value!r}: {message}" in str(caught.value)


def test_sets_are_disjoint_in_pool_order_and_come_back_when_released(tmp_path: Path) -> None:
    allocator = DeviceAllocator(POOL, tmp_path)
    other_worker = DeviceAllocator(POOL, tmp_path)  # (the same machine, another worker)
    first = allocator.acquire(2)
    second = other_worker.acquire(1)
    assert (first.visible_devices, second.visible_devices) == ("0,1", "2")
    with pytest.raises(DevicesBusyError, match="needs 2 GPUs and 1 of this worker's 4 are free"):
        allocator.acquire(2)
    third = allocator.acquire(1)  # (the refused request took nothing)
    assert third.devices == ("3",)
    first.release()
    first.release()  # (idempotent)
    assert allocator.acquire(2).devices == ("0", "1")


def test_more_devices_than_the_pool_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DevicesBusyError, match="needs 5 GPUs and this worker has 4"):
        DeviceAllocator(POOL, tmp_path).acquire(5)


def test_a_killed_holder_frees_its_devices(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from ace3_worker.gpu_sets import DeviceAllocator\n"
        f"held = DeviceAllocator({POOL!r}, Path({str(tmp_path)!r})).acquire(3)\n"
        "print(held.visible_devices, flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "0,1,2"
        allocator = DeviceAllocator(POOL, tmp_path)
        with pytest.raises(DevicesBusyError):
            allocator.acquire(2)
        os.kill(holder.pid, signal.SIGKILL)
    finally:
        holder.kill()
        holder.wait()
    assert allocator.acquire(4).visible_devices == "0,1,2,3"


def test_capacity_follows_the_device_list() -> None:
    cpu = Settings(worker_device="cpu", worker_cpu_processes=8)
    assert device_pool(cpu) is None, "a CPU worker without a list assigns no devices"
    assert local_capacity(cpu).device_count == 8
    listed = Settings(worker_device="cpu", worker_cpu_processes=8, worker_gpus="0,1,2")
    assert device_pool(listed) == ("0", "1", "2")
    assert local_capacity(listed).device_count == 3, "one device per rank: at most 3 ranks"


def test_a_cuda_worker_listing_a_gpu_the_machine_lacks_is_refused(tmp_path: Path) -> None:
    dev, table = tmp_path / "dev", tmp_path / "gpus"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia0", "nvidia1"):
        (dev / name).touch()
    for minor, bus_id in enumerate(("0000:17:00.0", "0000:65:00.0")):
        (table / bus_id).mkdir(parents=True)
        (table / bus_id / "information").write_text(
            f"GPU UUID: \t GPU-{minor}aaa-0000\nDevice Minor: \t {minor}\n"
        )
    cuda = Settings(worker_device="cuda", worker_gpus="0,1")
    assert device_pool_problem(cuda, dev, table) is None
    missing = Settings(worker_device="cuda", worker_gpus="1,2")
    assert device_pool_problem(missing, dev, table) == (
        "ACE3_WORKER_GPUS=1,2: no GPU 2 on this machine"
    )
    cpu = Settings(worker_device="cpu", worker_gpus="1,2")
    assert device_pool_problem(cpu, dev, table) is None, "a CPU worker only hands the list out"


@pytest.fixture()
def supervisor(tmp_path: Path) -> Supervisor:
    settings = Settings(
        data_dir=tmp_path,
        worker_device="cpu",
        worker_cpu_processes=4,
        worker_gpus="0,1,2,3",
        worker_gpu_lock_dir=tmp_path / "gpu-locks",
        unfit_republish_seconds=30,
        queue_name="gpu-sets-test",
        sandbox="none",  # (the hand-back is what is tested: no sandbox probe)
    )
    upgrade(settings.resolved_database_url)
    return Supervisor(settings)


def test_a_job_that_needs_more_than_the_free_devices_is_handed_back(
    supervisor: Supervisor,
) -> None:
    """Two devices of four run another job: a 3-GPU job fits the worker, not its free devices
    now, so it goes back to the queue (for another worker, or this one later), unclaimed."""
    busy = DeviceAllocator(POOL, supervisor.settings.resolved_worker_gpu_lock_dir).acquire(2)
    with supervisor.sessions() as session:
        job = insert_job(session, num_processes=3, config={"num_gpus": 3})
        session.commit()
        job_id = job.id
    supervisor.run(job_id)
    with supervisor.sessions() as session:
        after = session.get(Job, job_id)
        assert after is not None
        assert (after.state, after.attempt, after.worker_id) == ("queued", 0, None)
    [path] = sorted((supervisor.settings.broker_dir / "out").glob("*"))
    headers = json.loads(path.read_text())["headers"]
    assert job_id in headers["argsrepr"]
    assert datetime.fromisoformat(headers["eta"]) > utcnow() + timedelta(seconds=25)
    busy.release()
    assert supervisor.devices is not None
    assert supervisor.devices.acquire(4).devices == POOL, "the refused job kept no device"


def test_a_claim_holds_the_free_devices_keeps_what_it_needs_and_makes_others_wait(
    tmp_path: Path,
) -> None:
    import threading

    first = DeviceAllocator(["0", "1", "2", "3"], tmp_path)
    second = DeviceAllocator(["0", "1", "2", "3"], tmp_path)
    entered = threading.Event()
    seen: list[tuple[str, ...]] = []

    def other_slot() -> None:
        entered.set()
        with second.reserving_free() as free:  # waits until the first claim has decided
            seen.append(free.devices)
            free.keep(2)
        seen.append(free.devices)

    with first.reserving_free() as held:
        assert held.devices == ("0", "1", "2", "3")
        thread = threading.Thread(target=other_slot)
        thread.start()
        entered.wait(5)
        thread.join(0.3)
        assert thread.is_alive() and seen == []  # (the other slot waits for the decision)
        held.keep(2)
    thread.join(5)
    assert held.devices == ("0", "1") and seen == [("2", "3"), ("2", "3")]
    held.release()
    with first.reserving_free() as free:
        assert free.devices == ("0", "1")  # (the second slot still holds 2 and 3)
        free.release()
