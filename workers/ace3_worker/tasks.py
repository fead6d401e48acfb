"""Celery tasks. They take a job id, never an object, and reread the row."""

from __future__ import annotations

from ace3_control.queue import RUN_JOB_TASK
from ace3_worker.celery_app import app
from ace3_worker.supervisor import run_job


@app.task(name=RUN_JOB_TASK, ignore_result=True)
def run_job_task(job_id: str) -> None:
    run_job(job_id)
