"""``client.workers``: the live workers as typed objects, and the fit rule the server admits by."""

from __future__ import annotations

import httpx

import ace3
from ace3.client.types import Worker

ROWS = [
    {"id": "a", "hostname": "cpu-box", "device_kind": "cpu", "device_count": 8, "slots": 2,
     "queue": "ace3.jobs", "started_at": "2026-11-21T07:00:00Z",
     "last_seen_at": "2026-11-21T07:05:00Z", "added_later": 1},
    {"id": "b", "device_kind": "cuda", "device_count": 2},
]  # fmt: skip


def test_workers_list_reads_get_v1_workers() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path} {request.headers['authorization']}")
        return httpx.Response(200, json={"data": ROWS})

    with ace3.Client(api_key="k", transport=httpx.MockTransport(handler)) as client:
        cpu, gpu = client.workers.list()
    assert seen == ["GET /v1/workers Bearer k"]
    assert (cpu.device_kind, cpu.device_count, cpu.slots, cpu.hostname) == ("cpu", 8, 2, "cpu-box")
    assert cpu.last_seen_at is not None and gpu.slots == 1


def test_fits_follows_the_admission_rule() -> None:
    cpu = Worker(id="a", device_kind="cpu", device_count=8)
    gpu = Worker(id="b", device_kind="cuda", device_count=2)
    assert cpu.fits(8) and cpu.fits(4, "gloo") and not cpu.fits(9)
    assert not cpu.fits(1, "nccl"), "nccl needs a CUDA worker"
    assert gpu.fits(2, "nccl") and gpu.fits(2) and not gpu.fits(3, "nccl")
