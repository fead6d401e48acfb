"""The worker's Celery app: the server's shared configuration plus this package's task module."""

from __future__ import annotations

from ace3_server.queue import make_celery
from ace3_server.settings import get_settings

settings = get_settings()
app = make_celery(settings, main="ace3-worker")
app.conf.worker_concurrency = settings.worker_slots
app.conf.include = ["ace3_worker.tasks"]
