"""The worker's Celery app: the server's shared configuration plus this package's task module,
and the worker registry hooks (register before consuming, heartbeat, deregister at shutdown)."""

from __future__ import annotations

import atexit
import logging
from typing import Any

from celery import signals
from celery._state import get_current_task
from sqlalchemy.exc import SQLAlchemyError

from ace3_control.log_format import JsonFormatter, use_formatter
from ace3_control.queue import RUN_JOB_TASK, make_celery
from ace3_control.settings import get_settings
from ace3_worker.device import device_pool_problem, local_capacity
from ace3_worker.drain import request_drain
from ace3_worker.registration import Registration
from ace3_worker.sandbox.cgroup import CgroupUnavailableError, check_cgroup_root, sweep_cgroups
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.sandbox.plan import SandboxUnavailableError, sandbox_plan

logger = logging.getLogger(__name__)

settings = get_settings()
app = make_celery(settings, main="ace3-worker")
app.conf.worker_concurrency = settings.worker_slots
# Take a message only when a slot is free to run it (Redis; Celery >= 5.6): a worker whose
# slots all run long jobs would otherwise hold up to one queued job per slot that an idle
# worker could start now. (A job that fits a free slot but not the free GPUs is handed back by
# the supervisor: ace3_worker.gpu_sets.)
app.conf.worker_disable_prefetch = settings.resolved_broker_url.startswith(
    ("redis://", "rediss://")
)
app.conf.include = ["ace3_worker.tasks"]

_registration: Registration | None = None


def registered_worker_id() -> str | None:
    """The registry id of this Celery worker (registered in its main process before the pool
    forks, so all its slots share it); None before it registered."""
    return _registration.worker_id if _registration is not None else None


def _task_fields() -> dict[str, Any]:
    task = get_current_task()
    if task is None or task.request is None or task.request.id is None:
        return {}
    return {"task_id": task.request.id, "task_name": task.name}


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _json_logs(logger: logging.Logger | None = None, **_: Any) -> None:
    """ACE3_LOG_FORMAT=json: Celery's own handlers (worker and task loggers) write JSON lines,
    with the task's id and name while one runs."""
    if settings.log_format == "json" and logger is not None:
        use_formatter(logger, JsonFormatter(extra_fields=_task_fields))
        logging.captureWarnings(True)  # Python warnings become (JSON) log records too


@signals.worker_init.connect
def _register(sender: Any = None, **_: Any) -> None:
    """In the main process, before the pool starts and before any message is consumed."""
    global _registration
    if getattr(sender, "app", None) is not app or _registration is not None:
        return
    try:  # (decided here, before the pool forks: every child inherits it)
        sandbox_plan(settings)
    except SandboxUnavailableError as exc:
        logger.critical("ace3 worker: %s", exc)
        raise SystemExit(f"ace3 worker: {exc}") from exc
    if problem := device_pool_problem(settings):  # (a GPU the machine lacks: refuse now)
        logger.critical("ace3 worker: %s", problem)
        raise SystemExit(f"ace3 worker: {problem}")
    if settings.job_cgroup_root is not None:  # (jobs' memory cgroups: refuse what cannot work)
        try:
            check_cgroup_root(settings.job_cgroup_root)
        except CgroupUnavailableError as exc:
            logger.critical("ace3 worker: %s", exc)
            raise SystemExit(f"ace3 worker: {exc}") from exc
        sweep_cgroups(settings.job_cgroup_root)
    logger.info("job limits: %s", JobLimits.from_settings(settings).describe())
    # `ace3 worker --concurrency N` overrides ACE3_WORKER_SLOTS.
    concurrency = getattr(sender, "concurrency", None)
    slots = concurrency if isinstance(concurrency, int) and concurrency > 0 else None
    _registration = Registration(settings, local_capacity(settings), slots)
    try:
        _registration.register(announce=False)
    except SQLAlchemyError:
        logger.exception("could not register this worker; the next heartbeat tries again")
    atexit.register(_registration.stop)


@signals.worker_process_init.connect
def _prepare_warm_sandbox(**_: Any) -> None:
    """In each slot (a pool process, on its main thread), before its first message: the
    sandbox its first job runs in (:mod:`ace3_worker.warm`)."""
    try:
        app.tasks[RUN_JOB_TASK].supervisor.warm.prepare()
    except Exception:  # (never in the way of the slot: its first job then starts cold)
        logger.exception("could not prepare this slot's warm sandbox")


@signals.worker_ready.connect
def _start_heartbeats(**_: Any) -> None:
    # After the pool's children were forked: none of them inherits the heartbeat thread.
    if _registration is not None:
        _registration.announce()
        _registration.start_heartbeats()


@signals.worker_shutting_down.connect
def _drain(sig: Any = None, how: Any = None, **_: Any) -> None:
    """SIGTERM (or SIGINT) to the worker: a warm shutdown, which no longer claims jobs;
    preempt the running attempts instead of waiting for them (:mod:`ace3_worker.drain`)."""
    request_drain(f"{sig or 'shutdown'}, {how or 'warm'} shutdown")


@signals.worker_shutdown.connect
def _deregister(sender: Any = None, **_: Any) -> None:
    if _registration is not None and getattr(sender, "app", None) is app:
        _registration.stop()
