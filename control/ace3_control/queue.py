"""The Celery configuration shared by the publisher (API) and the worker; messages carry ids only.

The API never imports the worker package: it publishes the task by name.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from ace3_control.settings import Settings

RUN_JOB_TASK = "ace3.run_job"


def celery_config(settings: Settings) -> dict[str, Any]:
    config: dict[str, Any] = {
        "broker_url": settings.resolved_broker_url,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_serializer": "json",
        "task_ignore_result": True,
        # Long training must not wait unacknowledged on Redis (its visibility timeout would hand
        # it to a second worker): ack on receipt, and let the database lease do the rest.
        "task_acks_late": False,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": settings.queue_name,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
    }
    if config["broker_url"].startswith("filesystem://"):
        folder = settings.broker_dir
        for sub in ("out", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        config["broker_transport_options"] = {
            "data_folder_in": str(folder / "out"),
            "data_folder_out": str(folder / "out"),
            "processed_folder": str(folder / "processed"),
            # The exchange table; kombu's default is ./control in the current directory.
            "control_folder": str(folder / "control"),
            "store_processed": False,
            # The file broker polls its folder; Redis pushes. 0.1 s keeps pickup latency small.
            "polling_interval": 0.1,
        }
    return config


def make_celery(settings: Settings, main: str = "ace3") -> Celery:
    app = Celery(main, set_as_current=False)
    app.conf.update(celery_config(settings))
    return app


def publisher_config(settings: Settings) -> dict[str, Any]:
    """What a publisher adds to :func:`celery_config`: bounded waits on the broker.

    Without them a publish to a frozen Redis (a network partition, a stopped process) waits
    for as long as the freeze lasts. With them it fails after a few ``broker_timeout_seconds``
    and the caller leaves the job to the reconciler. Only publishers get them: a worker's
    consumer blocks on Redis on purpose, and its connection's timeouts stay Celery's."""
    timeout = settings.broker_timeout_seconds
    config: dict[str, Any] = {
        "broker_connection_timeout": timeout,
        "task_publish_retry_policy": {
            "max_retries": settings.broker_publish_retries,
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.2,
        },
    }
    if settings.resolved_broker_url.startswith(("redis://", "rediss://")):
        config["broker_transport_options"] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry_on_timeout": False,
        }
    return config


class JobPublisher:
    """Publishes "job <id> has work" messages; the database row is the truth.

    A publish blocks its thread for at most a few ``broker_timeout_seconds`` (then raises):
    the API publishes on a thread of its own (``ace3_server.services.publishing``)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._app = make_celery(settings, main="ace3-publisher")
        self._app.conf.update(publisher_config(settings))

    def publish(self, job_id: str, countdown: float | None = None) -> None:
        """Send the message now; with ``countdown`` (seconds) it is not run before then."""
        self._app.send_task(
            RUN_JOB_TASK, args=[job_id], queue=self._settings.queue_name, countdown=countdown
        )

    def close(self) -> None:
        self._app.close()
