"""One settings object for the server, the worker and the CLI, read from ACE3_* variables.

Defaults are the embedded single-machine setup (SQLite, a filesystem broker, storage under
``ACE3_DATA_DIR``); production sets ``ACE3_DATABASE_URL`` (Postgres) and ``ACE3_BROKER_URL``
(Redis).
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ACE3_", extra="ignore")

    data_dir: Path = Field(Path(".ace3"), description="Root for the embedded defaults below.")
    database_url: str | None = Field(
        None, description="postgresql://... or sqlite:///...; default: SQLite under data_dir."
    )
    broker_url: str | None = Field(
        None, description="redis://...; default: a filesystem broker under data_dir."
    )
    queue_name: str = Field("ace3.jobs", description="Celery queue the jobs are published on.")
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
    work_dir: Path | None = Field(
        None, description="Where a worker prepares job directories; default data_dir/jobs."
    )
    max_upload_bytes: int = Field(
        1 << 30, ge=1, description="Largest accepted upload (413 past it)."
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
        5.0, gt=0, description="How often a worker renews its lease and reads the cancel flag."
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
        10.0, gt=0, description="How often the API re-publishes lost messages and expires leases."
    )
    republish_after_seconds: float = Field(
        30.0, gt=0, description="Re-publish a queued job nobody claimed after this long."
    )
    max_retries: int = Field(
        2,
        ge=0,
        description="Extra attempts for a job whose worker died or whose processes were killed.",
    )
    worker_slots: int = Field(1, ge=1, description="Jobs one worker runs at once.")
    warm_launch: bool = Field(
        True,
        description="Each worker slot keeps a job sandbox started ahead of time whose launcher "
        "has imported torch, torchrun's agent and the engine (no user code); a single-node job "
        "is handed to it and starts in about a second. false: every job starts its sandbox and "
        "torchrun when it is claimed (the cold path), e.g. to keep the memory an idle launcher "
        "holds (a few hundred MB per slot), or to rule the warm path out while diagnosing.",
    )
    worker_device: str = Field(
        "auto", pattern="^(auto|cpu|cuda)$", description="auto: cuda when torch sees a GPU."
    )
    worker_cpu_processes: int | None = Field(
        None,
        ge=1,
        description="Processes one job may run on a CPU worker (what it advertises as its "
        "capacity); default: the cores this process may use.",
    )
    worker_gpus: str | None = Field(
        None,
        description="The GPUs this worker hands to its jobs, comma-separated indices (PCI bus "
        "order, as nvidia-smi numbers them) or GPU-<uuid> values, e.g. 0,1,2,3: each running "
        "job (each node of a multi-node job) gets its own num_gpus of them as its "
        "CUDA_VISIBLE_DEVICES, never a device another running job holds. Default (unset or "
        "empty): on a CUDA worker, every GPU it sees (its own CUDA_VISIBLE_DEVICES, if set); on a "
        "CPU worker, no device list (CPU jobs are not assigned devices).",
    )
    worker_gpu_lock_dir: Path | None = Field(
        None,
        description="Where the workers of this machine lock the GPUs their running jobs hold "
        "(the same directory for every worker of the machine, so two workers sharing GPUs "
        "never hand one to two jobs); default: sandbox_lock_dir/gpus for a root worker, else "
        "<temporary directory>/ace3-gpus-<uid>.",
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
    gang_wait_seconds: float = Field(
        300.0,
        gt=0,
        description="How long the workers that claimed nodes of a multi-node job wait for the "
        "rest of its num_nodes workers before the job fails (each holds a slot meanwhile).",
    )
    worker_advertise_host: str | None = Field(
        None,
        min_length=1,
        description="The address other workers reach this one at: the rendezvous endpoint of "
        "the multi-node jobs it leads, and torchrun's --local-addr. Default: the address this "
        "machine's hostname resolves to (127.0.0.1 when it does not resolve).",
    )
    sandbox: str = Field(
        "auto",
        pattern="^(auto|bwrap|uid|none)$",
        description="How a worker isolates the jobs it runs (docs/security.md). bwrap: "
        "bubblewrap namespaces (own PID, mount, IPC and, single-node, network namespace; only the "
        "job directory visible) and, for a worker running as root, a dedicated uid per job; uid: "
        "only the dedicated uid, rlimits and file permissions (where namespaces are not "
        "allowed; needs root); none: no isolation (your own code on your own machine only); "
        "auto: bwrap when it works here, else uid when running as root, else the worker refuses "
        "to start.",
    )
    sandbox_uid_base: int = Field(
        61000,
        ge=1000,
        le=(1 << 31) - 2,
        description="First of the uids (and gids) a root worker runs jobs as, one per running "
        "job; no account of the machine may use them.",
    )
    sandbox_uid_count: int = Field(
        64,
        ge=1,
        le=65536,
        description="How many uids from sandbox_uid_base jobs may use: one per running job and "
        "one per slot's prepared (warm) sandbox, so at least twice the slots of every worker of "
        "the machine (with fewer free, a slot prepares no sandbox and its next job starts cold).",
    )
    sandbox_lock_dir: Path = Field(
        Path("/run/ace3-sandbox"),
        description="Where workers on this machine take the locks that give each running job "
        "its own uid (must be the same directory for every worker of the machine).",
    )
    job_memory_bytes: int | None = Field(
        None,
        ge=1 << 26,
        description="Memory one process of a job may allocate (RLIMIT_DATA; also the size of "
        "its /dev/shm); default: the machine's memory divided by the worker's slots.",
    )
    job_max_processes: int = Field(
        4096,
        ge=16,
        description="Processes and threads a job's uid may run at once (RLIMIT_NPROC).",
    )
    job_cpu_seconds: int | None = Field(
        None,
        ge=1,
        description="CPU seconds one process of a job may use (RLIMIT_CPU); default none.",
    )
    max_checkpoint_bytes: int = Field(
        64 << 30, ge=1, description="Largest checkpoint file a job may hand the worker."
    )
    max_log_bytes_per_job: int = Field(
        64 << 20,
        ge=1024,
        description="Log bytes one attempt of a job may store; past it lines are dropped and "
        "counted.",
    )
    max_log_lines_per_second: float = Field(
        500.0,
        gt=0,
        description="Sustained log lines per second one attempt may store (bursts of ten seconds' "
        "worth pass); past it lines are dropped and counted.",
    )
    max_log_bytes_per_second: float = Field(
        256 * 1024,
        gt=0,
        description="Sustained log bytes per second one attempt may store (bursts of ten "
        "seconds' worth pass); past it lines are dropped and counted.",
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

    @field_validator("worker_gpus")
    @classmethod
    def _check_worker_gpus(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            return ",".join(parse_device_list(value))
        except ValueError as exc:
            raise ValueError(f"ACE3_WORKER_GPUS={value!r}: {exc}") from None

    @property
    def resolved_worker_gpus(self) -> tuple[str, ...] | None:
        """ACE3_WORKER_GPUS as a tuple of device names; None when unset."""
        return None if self.worker_gpus is None else tuple(self.worker_gpus.split(","))

    @property
    def resolved_worker_gpu_lock_dir(self) -> Path:
        if self.worker_gpu_lock_dir is not None:
            return self.worker_gpu_lock_dir
        if os.geteuid() == 0:
            return self.sandbox_lock_dir / "gpus"
        return Path(tempfile.gettempdir()) / f"ace3-gpus-{os.geteuid()}"

    @property
    def resolved_storage_dir(self) -> Path:
        return (self.storage_dir or self.data_dir / "storage").resolve()

    @property
    def resolved_work_dir(self) -> Path:
        return (self.work_dir or self.data_dir / "jobs").resolve()

    @property
    def resolved_worker_cpu_processes(self) -> int:
        """ACE3_WORKER_CPU_PROCESSES, else the cores this process may run on (at least 1)."""
        if self.worker_cpu_processes is not None:
            return self.worker_cpu_processes
        return max(1, usable_cores())

    @property
    def resolved_job_memory_bytes(self) -> int:
        """ACE3_JOB_MEMORY_BYTES, else the machine's memory shared by the worker's slots."""
        if self.job_memory_bytes is not None:
            return self.job_memory_bytes
        return max(1 << 30, physical_memory_bytes() // self.worker_slots)

    @property
    def resolved_worker_stale_after_seconds(self) -> float:
        return self.worker_stale_after_seconds or 3 * self.heartbeat_seconds

    @property
    def resolved_worker_advertise_host(self) -> str:
        """ACE3_WORKER_ADVERTISE_HOST, else the address the hostname resolves to."""
        if self.worker_advertise_host:
            return self.worker_advertise_host
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"

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


_DEVICE_NAME = re.compile(r"^(\d+|(GPU|MIG)-[A-Za-z0-9-]+)$")


def parse_device_list(value: str) -> tuple[str, ...]:
    """``"0, 1,GPU-8f2a..."`` -> ``("0", "1", "GPU-8f2a...")``: distinct CUDA device indices or
    UUIDs; a ValueError naming the bad entry otherwise."""
    devices = tuple(part.strip() for part in value.split(","))
    for device in devices:
        if not _DEVICE_NAME.match(device):
            raise ValueError(
                f"{device!r} is not a GPU index or UUID: give comma-separated indices or "
                "GPU-<uuid> values, e.g. 0,1,2,3"
            )
    normalised = tuple(str(int(d)) if d.isdigit() else d for d in devices)
    repeated = sorted({d for d in normalised if normalised.count(d) > 1})
    if repeated:
        raise ValueError(f"GPU {', '.join(repeated)} is listed more than once")
    return normalised


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def physical_memory_bytes() -> int:
    """The machine's memory (what the sandbox's default per-process limit is derived from)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30


@lru_cache
def get_settings() -> Settings:
    return Settings()
