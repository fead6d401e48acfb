"""ACE3 rows written as OpenAI's objects: a dataset as a ``file``, a job as a
``fine_tuning.job``, a checkpoint as a ``fine_tuning.job.checkpoint``; and a job's metrics as
the file its ``result_files`` name (``ftmetrics-<job id>``: ``openai_api.results``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ace3_control.models import TERMINAL_STATES, Job, JobCheckpoint, StoredDataset
from ace3_server.openai_api.mapping import resolved_hyperparameters, status_of

METRICS_FILE_PREFIX = "ftmetrics-"
#: ACE3 metric names -> OpenAI's (checkpoint metrics, metric events).
METRIC_NAMES = {"train_loss": "train_loss", "val_loss": "valid_loss", "val_accuracy": "valid_mean_token_accuracy"}  # fmt: skip
#: final_metrics keys that count the tokens a run trained on, first found wins.
TOKEN_COUNTS = ("trained_tokens", "tokens")


def unix(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


def file_object(row: StoredDataset) -> dict[str, Any]:
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.size_bytes,
        "created_at": unix(row.created_at),
        "filename": row.filename,
        "purpose": "fine-tune",
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def metrics_file_id(job_id: str) -> str:
    return f"{METRICS_FILE_PREFIX}{job_id}"


def metrics_file_object(job: Job, size: int) -> dict[str, Any]:
    return {
        "id": metrics_file_id(job.id),
        "object": "file",
        "bytes": size,
        "created_at": unix(job.finished_at or job.created_at),
        "filename": f"{job.id}-metrics.csv",
        "purpose": "fine-tune-results",
        "status": "processed",
        "status_details": None,
        "expires_at": None,
    }


def openai_metric_name(name: str) -> str:
    return METRIC_NAMES.get(name, name)


def trained_tokens(final_metrics: dict[str, Any] | None) -> int | None:
    for key in TOKEN_COUNTS:
        value = (final_metrics or {}).get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return None


def job_error(job: Job) -> dict[str, Any] | None:
    if job.state != "failed":
        return None
    return {"code": "job_failed", "message": job.error or "the job failed", "param": None}


def job_object(job: Job) -> dict[str, Any]:
    """Any job of the caller as a fine-tuning job; one made through this API shows what it
    was asked for (``jobs.fine_tune_request``)."""
    request = job.fine_tune_request or {}
    hyperparameters = resolved_hyperparameters(job.config)
    finished = job.state in TERMINAL_STATES
    return {
        "id": job.id,
        "object": "fine_tuning.job",
        "created_at": unix(job.created_at),
        "finished_at": unix(job.finished_at) if finished else None,
        "model": request.get("model", job.model_id),
        "fine_tuned_model": job.fine_tuned_model_id,
        "organization_id": job.owner_id,
        "status": status_of(job.state),
        "hyperparameters": hyperparameters,
        "training_file": job.dataset_id,
        "validation_file": job.validation_dataset_id,
        "result_files": [metrics_file_id(job.id)] if finished else [],
        "trained_tokens": trained_tokens(job.final_metrics),
        "error": job_error(job),
        "seed": job.config.get("seed"),
        "estimated_finish": None,
        "integrations": [],
        "metadata": request.get("metadata"),
        "method": {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}},
        "user_provided_suffix": request.get("suffix"),
    }


def checkpoint_object(row: JobCheckpoint) -> dict[str, Any]:
    metrics: dict[str, Any] = {"step": row.step}
    for name, value in (row.metrics or {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics[openai_metric_name(name)] = value
    return {
        "id": row.id,
        "object": "fine_tuning.job.checkpoint",
        "created_at": unix(row.created_at),
        # the checkpoint's id: a job's init_from_checkpoint_id or resume_from_checkpoint
        "fine_tuned_model_checkpoint": row.id,
        "step_number": row.step,
        "metrics": metrics,
        "fine_tuning_job_id": row.job_id,
    }
