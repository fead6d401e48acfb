"""One settings object for the server, the worker and the CLI, read from ACE3_* variables.

Defaults are the embedded single-machine setup (SQLite, a filesystem broker, storage under
``ACE3_DATA_DIR``); production sets ``ACE3_DATABASE_URL`` (Postgres) and ``ACE3_BROKER_URL``
(Redis). The worker's own settings (its slots, devices, sandbox and job limits) are declared in
:mod:`ace3_control.worker_settings` and read the same way, as fields of this object.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from ace3_control.s3_uris import parse_sources
from ace3_control.worker_settings import (
    WorkerSettings,
    disk_share_bytes,
    parse_device_list,
    physical_memory_bytes,
    usable_cores,
)

__all__ = [
    "Settings",
    "WorkerSettings",
    "get_settings",
    "parse_device_list",
    "physical_memory_bytes",
    "usable_cores",
]


class Settings(WorkerSettings):
    model_config = SettingsConfigDict(env_prefix="ACE3_", extra="ignore")
    data_dir: Path = Field(Path(".ace3"), description="Root for the embedded defaults below.")
    database_url: str | None = Field(
        None, description="postgresql://... or sqlite:///...; default: SQLite under data_dir."
    )
    broker_url: str | None = Field(
        None, description="redis://...; default: a filesystem broker under data_dir."
    )
    queue_name: str = Field("ace3.jobs", description="Celery queue the jobs are published on.")
    broker_timeout_seconds: float = Field(
        2.0,
        gt=0,
        description="Socket and connect timeout of a publish to a Redis broker: a frozen or "
        "unreachable broker fails the publish after this long (logged; the reconciler "
        "re-publishes the job).",
    )
    broker_publish_retries: int = Field(
        1,
        ge=0,
        description="Times a failed publish is tried again (0.2 s apart) before it is left to "
        "the reconciler.",
    )
    publish_backlog: int = Field(
        1000,
        ge=1,
        description="Messages an API process holds for its publishing thread; past it a "
        "publish is dropped and left to the reconciler.",
    )
    storage_dir: Path | None = Field(
        None,
        description="Artifact store root; default data_dir/storage. With storage_url set, only "
        "staging files (uploads being checked) go here.",
    )
    storage_url: str | None = Field(
        None,
        description="s3://bucket/prefix: an S3-compatible object store holds the artifacts "
        "(credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, region from AWS_REGION); "
        "unset: the local storage_dir.",
    )
    s3_endpoint_url: str | None = Field(
        None, description="The S3 endpoint of a non-AWS store (MinIO, SeaweedFS, R2...)."
    )
    s3_public_endpoint_url: str | None = Field(
        None,
        description="The endpoint clients reach the store at, for presigned download URLs "
        "(default: s3_endpoint_url).",
    )
    s3_presigned_downloads: bool = Field(
        False,
        description="Downloads answer 307 to a presigned URL of the object store instead of "
        "streaming through the API.",
    )
    s3_presigned_uploads: bool = Field(
        True,
        description="With an S3 artifact store, the shards of an uploaded shard directory go "
        "straight to the store through presigned multipart URLs (signed for "
        "s3_public_endpoint_url when set), not through the API; off: through the API.",
    )
    shard_part_bytes: int = Field(
        64 << 20,
        ge=5 << 20,
        le=5 << 30,
        description="The part size of a shard's presigned multipart upload (S3's bounds: 5 MiB "
        "to 5 GiB); larger when a shard would need more than 10,000 parts.",
    )
    dataset_sources: str | None = Field(
        None,
        description="The bucket prefixes datasets may be registered from, comma-separated "
        "(s3://bucket/ or s3://bucket/team/; a plain string, not JSON); read with the service's "
        "own S3 settings (s3_endpoint_url, AWS_*), which no job ever gets. Unset: none. The "
        "artifact store's own bucket and prefix are refused in every case.",
    )
    dataset_listing_seconds: float = Field(
        300.0,
        gt=0,
        description="The most seconds registering one dataset may spend listing its prefix and "
        "reading its parquet footers (422 naming uri past it).",
    )
    dataset_cache_dir: Path | None = Field(
        None,
        description="A worker's node-wide cache of dataset shards (hidden from jobs); default "
        "data_dir/dataset-cache. On the work directory's filesystem, shards are hard-linked "
        "into the jobs that read them instead of copied.",
    )
    dataset_cache_bytes: int = Field(
        20 * 1024**3,
        ge=1,
        description="The most bytes of shards a worker's cache holds; least recently used "
        "shards no running job reads are evicted first. A shard larger than this fails the job "
        "that needs it. Each running job may keep at most its share (this / ACE3_WORKER_SLOTS) "
        "linked; a job whose readers' current shards (num_workers x ranks of the largest "
        "shards) do not fit in its share is refused when it starts.",
    )
    dataset_cache_wait_seconds: float = Field(
        600.0,
        gt=0,
        description="How long a job's reader may wait for room in the dataset cache for the "
        "shard it opens (the cache full of shards other running jobs read) before the job "
        "fails saying so.",
    )
    work_dir: Path | None = Field(
        None, description="Where a worker prepares job directories; default data_dir/jobs."
    )
    max_upload_bytes: int = Field(
        1 << 30, ge=1, description="Largest accepted upload (413 past it)."
    )
    max_json_bytes: int = Field(
        32 << 20,
        ge=1,
        description="Largest accepted JSON request body (413 past it, refused before it is read "
        "when its Content-Length says so).",
    )
    max_extracted_bytes: int = Field(
        4 << 30, ge=1, description="Largest total size an uploaded archive may extract to."
    )
    max_archive_members: int = Field(
        100_000, ge=1, description="Most files and directories an uploaded archive may hold."
    )
    max_artifact_bytes: int = Field(
        2 << 30,
        ge=0,
        description="Most bytes of artifacts (files under output/artifacts/) one job may store; "
        "files past it are not synced, and the job's log says so.",
    )
    artifact_sync_seconds: float = Field(
        1.0, gt=0, description="How often a worker syncs a running job's artifacts directory."
    )
    lease_seconds: float = Field(
        60.0, gt=0, description="A running job's lease; the worker renews it with every heartbeat."
    )
    heartbeat_seconds: float = Field(
        2.0,
        gt=0,
        description="How often a worker renews its registry row, its jobs' leases and reads the "
        "cancel flag; a worker silent for 3 of them is dead and its jobs are re-queued.",
    )
    cancel_grace_seconds: float = Field(
        10.0, ge=0, description="SIGTERM to SIGKILL delay when cancelling."
    )
    worker_drain_grace_seconds: float = Field(
        60.0,
        gt=0,
        le=600,
        description="A draining worker (SIGTERM to `ace3 worker`): how long a preempted "
        "attempt's ranks have to checkpoint before SIGKILL; it caps a job's "
        "preemption_grace_seconds.",
    )
    max_preemptions: int = Field(
        100,
        ge=0,
        description="Preempted attempts (a draining worker) re-queued outside the retry budget; "
        "the next preemption fails the job.",
    )
    reconcile_interval_seconds: float = Field(
        2.0,
        gt=0,
        description="How often the API re-queues dead workers' jobs, re-publishes lost messages "
        "and expires leases.",
    )
    republish_after_seconds: float = Field(
        30.0, gt=0, description="Re-publish a queued job nobody claimed after this long."
    )
    max_retries: int = Field(
        2,
        ge=0,
        description="Extra attempts for a job whose worker died or whose processes were killed.",
    )
    worker_stale_after_seconds: float | None = Field(
        None,
        gt=0,
        description="A worker not seen for this long is gone (not counted for admission); "
        "default 3 x heartbeat_seconds.",
    )
    unschedulable_after_seconds: float = Field(
        600.0,
        gt=0,
        description="Fail a job queued this long while live workers exist and none can run it.",
    )
    unfit_republish_seconds: float = Field(
        2.0,
        gt=0,
        description="A worker that cannot run a queued job hands it back to the queue, delayed by "
        "this long.",
    )
    default_max_priority: Literal["high", "normal"] = Field(
        "normal",
        description="The highest job priority an owner may ask for unless an admin set theirs "
        "(ace3 owners set-quota OWNER --max-priority high): with 'normal', 'high' is a grant.",
    )
    log_retention_days: float | None = Field(
        None,
        gt=0,
        description="Archive the log lines of jobs finished this long ago to the store (a "
        "gzipped JSONL artifact of the job, ace3-retention/logs.jsonl.gz) and delete their rows; "
        "unset: keep them forever.",
    )
    metric_retention_days: float | None = Field(
        None,
        gt=0,
        description="Delete the metric points of jobs finished this long ago (the job's "
        "final_metrics stay); unset: keep them forever.",
    )
    retention_interval_seconds: float = Field(
        3600.0, gt=0, description="How often the API applies the retention settings."
    )
    retention_batch_jobs: int = Field(
        20, ge=1, description="Jobs archived or pruned per retention pass (bounded work)."
    )
    search_tick_seconds: float = Field(
        1.0, gt=0, description="How often the API advances active hyperparameter searches."
    )
    search_lease_seconds: float = Field(
        30.0, gt=0, description="A search driver's lease; another API process takes over after it."
    )
    webhook_max_attempts: int = Field(
        8, ge=1, le=50, description="POSTs of one webhook delivery before it is marked failed."
    )
    webhook_retry_base_seconds: float = Field(
        5.0,
        gt=0,
        description="The first retry delay of a webhook delivery; each next one is 6x longer "
        "(5 s, 30 s, 3 min, ...), with jitter, capped at 6 hours.",
    )
    webhook_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=60,
        description="How long one webhook delivery attempt may take in all: resolving and "
        "checking the host, connecting, sending and reading the answer.",
    )
    webhook_dns_timeout_seconds: float = Field(
        3.0, gt=0, le=30, description="How long resolving a webhook URL's host may take."
    )
    webhook_allow_private_networks: bool = Field(
        False,
        description="Allow webhook URLs that resolve to loopback, private, link-local or "
        "cloud metadata addresses (self-hosted clusters posting inside their network).",
    )
    webhook_max_per_owner: int = Field(
        20, ge=1, description="Most webhooks one owner may register."
    )
    webhook_retention_days: float = Field(
        30.0, gt=0, description="Delivered and failed webhook deliveries are kept this long."
    )
    webhook_poll_seconds: float = Field(
        1.0, gt=0, description="How often the API looks for webhook deliveries that are due."
    )
    stream_wake: Literal["notify", "poll"] = Field(
        "notify",
        description="How a live event stream learns of new rows on Postgres: 'notify' (one "
        "LISTEN connection per API process wakes the streams of the job a NOTIFY names) or "
        "'poll' (every stream re-reads every 0.25 s, the behaviour before). SQLite always polls.",
    )
    stream_safety_poll_seconds: float = Field(
        5.0,
        gt=0,
        description="With stream_wake=notify, how often a stream re-reads without a notification "
        "(a notification lost while the listener reconnected only delays an event by this).",
    )
    api_key_cache_seconds: float = Field(
        5.0,
        ge=0,
        description="How long an API process trusts a key it verified without asking the "
        "database again (0: never); a revoked key works that much longer at most.",
    )
    api_workers: int = Field(
        1, ge=1, description="Server processes `ace3 server` runs on its port (uvicorn workers)."
    )
    log_level: str = Field("info")
    log_format: Literal["text", "json"] = Field(
        "text",
        description="How the server and the worker write their own logs: text, or json (one "
        "JSON object a line: timestamp, level, logger, message, request_id, exception). A "
        "job's training log stored in the database is unaffected.",
    )
    metrics_token: SecretStr | None = Field(
        None,
        min_length=1,
        description="When set, GET /metrics needs 'Authorization: Bearer <token>' (401 "
        "otherwise). When unset, /metrics is OPEN to anyone who can reach the API: it carries "
        "no owner, job id or job name, but it does show cluster-wide counts (jobs by state "
        "across all owners, workers, slots, ingest totals) and request rates. Set it on any "
        "shared or internet-facing deployment.",
    )
    metrics_cache_seconds: float = Field(
        10.0,
        ge=0,
        description="How long an API process reuses the database figures of GET /metrics "
        "before reading them again. One read runs at a time per process whatever this is: "
        "concurrent scrapes wait for it and share its result, so scrapes cannot hold the "
        "database connections the API needs.",
    )

    @field_validator("dataset_sources")
    @classmethod
    def _check_dataset_sources(cls, value: str | None) -> str | None:
        """Each entry an s3://bucket/prefix/ (a bad one is a startup error naming it)."""
        if value is None or not value.strip():
            return None
        try:
            parse_sources(value)
        except ValueError as exc:
            raise ValueError(f"ACE3_DATASET_SOURCES={value!r}: {exc}") from None
        return value

    @property
    def resolved_storage_dir(self) -> Path:
        return (self.storage_dir or self.data_dir / "storage").resolve()

    @property
    def resolved_dataset_cache_dir(self) -> Path:
        return (self.dataset_cache_dir or self.data_dir / "dataset-cache").resolve()

    @property
    def resolved_env_cache_dir(self) -> Path:
        return (self.env_cache_dir or self.data_dir / "environments").resolve()

    @property
    def resolved_work_dir(self) -> Path:
        return (self.work_dir or self.data_dir / "jobs").resolve()

    @property
    def resolved_job_disk_bytes(self) -> int:
        """ACE3_JOB_DISK_BYTES, else a share of the work directory's filesystem's size
        (:func:`~ace3_control.worker_settings.disk_share_bytes`)."""
        if self.job_disk_bytes is not None:
            return self.job_disk_bytes
        return disk_share_bytes(self.resolved_work_dir, self.worker_slots)

    @property
    def resolved_worker_stale_after_seconds(self) -> float:
        return self.worker_stale_after_seconds or 3 * self.heartbeat_seconds

    @property
    def broker_dir(self) -> Path:
        return (self.data_dir / "broker").resolve()

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'ace3.db').resolve()}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or "filesystem://"


@lru_cache
def get_settings() -> Settings:
    return Settings()
