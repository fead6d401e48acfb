"""Celery tasks. They take a job id, never an object, and reread the row."""

from __future__ import annotations

from billiard.process import current_process
from celery import Task

from ace3_control.queue import RUN_JOB_TASK
from ace3_control.settings import get_settings
from ace3_worker.celery_app import app, registered_worker_id
from ace3_worker.supervisor import Supervisor


class SupervisedTask(Task):
    """Celery makes one instance of a task per worker process: it holds that process's
    :class:`Supervisor`, made on first use (after the pool's fork, in the child that runs the
    job), with the worker's registry id as its node id. What the supervisor remembers between
    messages (copies of a job handed back or passed on) lives as long as the process."""

    _supervisor: Supervisor | None = None

    @property
    def supervisor(self) -> Supervisor:
        if self._supervisor is None:
            self._supervisor = Supervisor(
                get_settings(),
                node_id=registered_worker_id(),
                keeps_warm_sandboxes=True,
                slot=getattr(current_process(), "index", 0),  # (billiard's pool index)
            )
        return self._supervisor


@app.task(name=RUN_JOB_TASK, ignore_result=True, bind=True, base=SupervisedTask)
def run_job_task(self: SupervisedTask, job_id: str) -> None:
    self.supervisor.run(job_id)
