"""The live workers and their capacity: what jobs this cluster can run (any owner's key)."""

from __future__ import annotations

from ace3_control.worker_registry import live_workers
from ace3_server.api.deps import OwnerDep, SessionDep, SettingsDep
from ace3_server.api.routing import resource_router
from ace3_server.schemas import WorkerList

router = resource_router("/workers", "workers")


@router.get("", response_model=WorkerList, operation_id="list_workers")
async def list_workers(
    session: SessionDep, owner_id: OwnerDep, settings: SettingsDep
) -> dict[str, object]:
    """Workers consuming this API's queue that heartbeated within the staleness window, oldest
    first. A job fits one when its ``num_gpus`` is at most the worker's ``device_count`` (and,
    for ``backend='nccl'``, the worker is a CUDA worker)."""
    del owner_id  # any valid key may look: workers belong to no owner
    return {"data": await live_workers(session, settings)}
