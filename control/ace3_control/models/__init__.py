"""SQLAlchemy 2.0 tables: owners and their keys, models, datasets, jobs and what jobs report,
searches, workers and webhooks, one module each; every name is importable from here."""

from __future__ import annotations

from ace3_control.models.base import Base, UTCDateTime, new_id, utcnow
from ace3_control.models.environments import Environment, EnvironmentState
from ace3_control.models.job_outputs import (
    JobArtifact,
    JobCheckpoint,
    JobLog,
    JobMetric,
    JobRecord,
)
from ace3_control.models.jobs import Job
from ace3_control.models.owners import ApiKey, Owner
from ace3_control.models.searches import Search, SearchTrial
from ace3_control.models.states import (
    ACTIVE_SEARCH_STATES,
    ACTIVE_STATES,
    TERMINAL_STATES,
    DeliveryState,
    JobPriority,
    JobState,
    NodeState,
    SearchState,
    TrialState,
)
from ace3_control.models.stored import (
    StoredDataset,
    StoredModel,
    StoredShard,
    UploadedCheckpoint,
    fetch_sha256,
)
from ace3_control.models.webhooks import Webhook, WebhookDelivery, WebhookEvent
from ace3_control.models.workers import JobNode, Worker

__all__ = [
    "ACTIVE_SEARCH_STATES",
    "ACTIVE_STATES",
    "TERMINAL_STATES",
    "ApiKey",
    "Base",
    "DeliveryState",
    "Environment",
    "EnvironmentState",
    "Job",
    "JobArtifact",
    "JobCheckpoint",
    "JobLog",
    "JobMetric",
    "JobNode",
    "JobPriority",
    "JobRecord",
    "JobState",
    "NodeState",
    "Owner",
    "Search",
    "SearchState",
    "SearchTrial",
    "StoredDataset",
    "StoredModel",
    "StoredShard",
    "TrialState",
    "UTCDateTime",
    "UploadedCheckpoint",
    "Webhook",
    "WebhookDelivery",
    "WebhookEvent",
    "Worker",
    "fetch_sha256",
    "new_id",
    "utcnow",
]
