"""Typed API objects (Model, Dataset, Job, Metric, LogLine, Checkpoint, Artifact, Worker) and
the resources that create, read, list, cancel and delete them: ``client.models``,
``client.datasets``, ``client.jobs``, ``client.checkpoints``, ``client.workers``. Each method is
one REST call of ``docs/api.md``.
"""

from __future__ import annotations

import builtins
import hashlib
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field

from ace3.client._sse import decode_event, follow_events
from ace3.client.pagination import CursorPage, ItemT
from ace3.config import TrainingConfig
from ace3.config.events import RunPlan
from ace3.config.specs import ARTIFACT_SCHEME
from ace3.errors import ChecksumMismatchError
from ace3.files import atomic_path

if TYPE_CHECKING:
    from ace3.client._http import HTTPClient

__all__ = [
    "Artifact",
    "Checkpoint",
    "Checkpoints",
    "Dataset",
    "Datasets",
    "Job",
    "JobEvent",
    "JobState",
    "Jobs",
    "LogLine",
    "LogPage",
    "Metric",
    "Model",
    "Models",
    "Worker",
    "Workers",
]


# -- response models ------------------------------------------------------------------------


class _APIObject(BaseModel):
    """Lenient on purpose: a field a newer server adds must not break an older SDK."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())


class Model(_APIObject):
    id: str
    name: str | None = None
    filename: str | None = None
    kind: str = "file"  # "file" or "archive"
    entry_module: str | None = None
    factory: str = "build_model"
    sha256: str
    size_bytes: int | None = None
    created_at: datetime | None = None


class Dataset(_APIObject):
    id: str
    name: str | None = None
    filename: str | None = None
    kind: str = "file"  # "file" or "directory"
    format: str | None = None
    sha256: str
    size_bytes: int | None = None
    created_at: datetime | None = None


class JobState(StrEnum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class Job(_APIObject):
    id: str
    name: str | None = None
    state: JobState | str = Field(union_mode="left_to_right")
    attempt: int = 0
    model_id: str | None = None
    dataset_id: str | None = None
    validation_dataset_id: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    model_kwargs: dict[str, Any] | None = None
    num_processes: int | None = None
    cancel_requested: bool = False
    exit_code: int | None = None
    error: str | None = None
    final_metrics: dict[str, Any] | None = None
    # The run's plan once its first attempt started (total optimizer steps, epochs, ...).
    plan: RunPlan | None = None
    resume_from_checkpoint: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class Metric(_APIObject):
    id: int | str | None = None
    step: int
    epoch: float | None = None
    name: str
    value: float
    created_at: datetime | None = None


class LogLine(_APIObject):
    seq: int
    attempt: int | None = None
    rank: int | None = None
    stream: str | None = None
    line: str
    created_at: datetime | None = None

    def format(self) -> str:
        """The line prefixed with its rank (``[rank 0] ...``) unless it already is."""
        if self.rank is None or self.line.startswith("[rank "):
            return self.line
        return f"[rank {self.rank}] {self.line}"


class Checkpoint(_APIObject):
    id: str
    job_id: str | None = None
    name: str
    step: int | None = None
    epoch: float | None = None
    attempt: int | None = None
    sha256: str | None = None
    size_bytes: int | None = None
    metrics: dict[str, Any] | None = None
    created_at: datetime | None = None


class Artifact(_APIObject):
    """A file the job wrote under its artifacts directory (``artifact://`` paths), as last
    synced by the worker: ``version`` grows by one each time its bytes changed."""

    path: str
    size_bytes: int
    sha256: str
    version: int = 1
    attempt: int | None = None
    updated_at: datetime | None = None


class Worker(_APIObject):
    """A live worker and what one job may use on it: ``device_count`` processes on
    ``device_kind`` (``"cuda"``: its GPUs; ``"cpu"``: the CPU processes it runs)."""

    id: str
    hostname: str | None = None
    device_kind: str
    device_count: int
    slots: int = 1
    queue: str | None = None
    started_at: datetime | None = None
    last_seen_at: datetime | None = None

    def fits(self, num_gpus: int, backend: str = "auto") -> bool:
        """Whether a job with this ``num_gpus`` and ``backend`` can run on this worker (the
        rule the server admits jobs by)."""
        if backend == "nccl" and self.device_kind != "cuda":
            return False
        return num_gpus <= self.device_count


@dataclass
class LogPage:
    """One page of ``GET /v1/jobs/{id}/logs``; pass ``next_after`` as ``after`` for more."""

    data: list[LogLine]
    next_after: int | None


@dataclass
class JobEvent:
    """One event of ``GET /v1/jobs/{id}/events``.

    ``type`` is ``state`` or ``end`` (``data`` a :class:`Job`), ``metric`` (a
    :class:`Metric`) or ``log`` (a :class:`LogLine`); an event type this SDK does not know
    keeps its raw decoded JSON. ``id`` is the resume cursor ``"<metrics_after>:<logs_after>"``.
    """

    type: str
    data: Any
    id: str | None = None


_EVENT_MODELS: dict[str, type[BaseModel]] = {
    "state": Job,
    "end": Job,
    "metric": Metric,
    "log": LogLine,
}


# -- resources ------------------------------------------------------------------------------


class _Resource:
    def __init__(self, http: HTTPClient):
        self._http = http

    def _list(
        self, path: str, item_type: type[ItemT], params: Mapping[str, Any], cursor: str | None
    ) -> CursorPage[ItemT]:
        """``GET path`` as a cursor page that fetches the following pages with the same query."""

        def fetch(next_cursor: str | None) -> CursorPage[ItemT]:
            payload = self._http.request(
                "GET", path, params={**params, "cursor": next_cursor}
            ).json()
            items = [item_type.model_validate(item) for item in payload.get("data") or []]
            return CursorPage(items, payload.get("next_cursor"), fetch)

        return fetch(cursor)


def _upload_file(path: str | os.PathLike[str] | BinaryIO, filename: str | None):
    """(filename, file object, close it?) for a multipart upload."""
    if isinstance(path, str | os.PathLike):
        handle = open(path, "rb")  # noqa: SIM115 - closed by the caller
        return filename or Path(path).name, handle, True
    name = filename or Path(getattr(path, "name", "upload.bin")).name
    return name, path, False


class Models(_Resource):
    """``/v1/models``: uploaded model code (a ``.py`` file or a package archive)."""

    def create(
        self,
        file: str | os.PathLike[str] | BinaryIO,
        *,
        filename: str | None = None,
        name: str | None = None,
        entry_module: str | None = None,
        factory: str = "build_model",
        idempotency_key: str | None = None,
    ) -> Model:
        """Upload model code. The server answers with the existing model when this owner
        already uploaded the same bytes, so the upload is retried (under one idempotency key,
        a new uuid4 unless given) when the connection fails or the server is busy."""
        upload_name, handle, close = _upload_file(file, filename)
        try:
            response = self._http.request(
                "POST",
                "/v1/models",
                files={"file": (upload_name, handle, "application/octet-stream")},
                data={"name": name, "entry_module": entry_module, "factory": factory},
                idempotency_key=idempotency_key or str(uuid.uuid4()),
            )
        finally:
            if close:
                handle.close()
        return Model.model_validate(response.json())

    def retrieve(self, model_id: str) -> Model:
        return Model.model_validate(self._http.request("GET", f"/v1/models/{model_id}").json())

    def list(
        self, *, sha256: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> CursorPage[Model]:
        return self._list("/v1/models", Model, {"sha256": sha256, "limit": limit}, cursor)

    def delete(self, model_id: str) -> None:
        self._http.request("DELETE", f"/v1/models/{model_id}")


class Datasets(_Resource):
    """``/v1/datasets``: uploaded training and validation data."""

    def create(
        self,
        file: str | os.PathLike[str] | BinaryIO,
        *,
        filename: str | None = None,
        name: str | None = None,
        kind: Literal["file", "directory"] = "file",
        idempotency_key: str | None = None,
    ) -> Dataset:
        """Upload a data file, or with ``kind="directory"`` a ``.tar.gz`` of a directory.
        The server answers with the existing dataset when these bytes were uploaded before;
        retried like :meth:`Models.create`."""
        upload_name, handle, close = _upload_file(file, filename)
        try:
            response = self._http.request(
                "POST",
                "/v1/datasets",
                files={"file": (upload_name, handle, "application/octet-stream")},
                data={"name": name, "kind": kind},
                idempotency_key=idempotency_key or str(uuid.uuid4()),
            )
        finally:
            if close:
                handle.close()
        return Dataset.model_validate(response.json())

    def retrieve(self, dataset_id: str) -> Dataset:
        response = self._http.request("GET", f"/v1/datasets/{dataset_id}")
        return Dataset.model_validate(response.json())

    def list(
        self, *, sha256: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> CursorPage[Dataset]:
        return self._list("/v1/datasets", Dataset, {"sha256": sha256, "limit": limit}, cursor)

    def delete(self, dataset_id: str) -> None:
        self._http.request("DELETE", f"/v1/datasets/{dataset_id}")


def _write_verified(response: Any, target: Path, expected: str | None, *, verify: bool) -> str:
    """Stream ``response`` into ``target`` through a temporary file in the same directory,
    renamed into place only when complete and (with ``verify``) matching both the server's
    ``x-checksum-sha256`` and ``expected``; return the sha256 of the bytes."""
    announced = response.headers.get("x-checksum-sha256")
    digest = hashlib.sha256()
    with atomic_path(target) as partial, partial.open("wb") as handle:
        for chunk in response.iter_bytes():
            digest.update(chunk)
            handle.write(chunk)
        handle.flush()
        actual = digest.hexdigest()
        if verify:
            for wanted in (announced, expected):
                if wanted and wanted.lower() != actual:
                    raise ChecksumMismatchError(str(target), wanted.lower(), actual)
    return actual


def _artifact_path(path: str, argument: str) -> str:
    """An artifact path as the server stores it (relative, '/'-separated); ``artifact://`` and
    surrounding slashes are dropped. ValueError naming ``argument`` for anything that could
    leave the artifacts directory."""
    if not isinstance(path, str):
        raise TypeError(f"{argument} must be a str (an artifact path), not {type(path).__name__}")
    text = path.removeprefix(ARTIFACT_SCHEME).strip("/")
    parts = text.split("/")
    if not text or any(part in ("", ".", "..") for part in parts) or "\\" in text:
        raise ValueError(
            f"{argument}={path!r} is not an artifact path: use a relative path like "
            "'tensorboard/events.out' as client.jobs.artifacts(job_id) lists them (no '..', no "
            "empty segments, '/' as separator)"
        )
    return text


_EVENT_ID = re.compile(r"^(\d+):(\d+)$")
_FILENAME = re.compile(r'filename="?([^";]+)"?')


class Jobs(_Resource):
    """``/v1/jobs``: training jobs, their metrics, logs, checkpoints and live events."""

    def create(
        self,
        *,
        model_id: str,
        dataset_id: str,
        config: TrainingConfig | Mapping[str, Any] | None = None,
        validation_dataset_id: str | None = None,
        model_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        idempotency_key: str | None = None,
        resume_from_checkpoint: str | Checkpoint | None = None,
    ) -> Job:
        """Submit a job. With an ``idempotency_key`` the request is retried safely (the same
        key on every attempt) and a repeat returns the job created the first time.

        ``resume_from_checkpoint`` (a :class:`Checkpoint` or its id, of any of your jobs) starts
        the job from that checkpoint: its weights, optimizer state, step and epoch, so with a
        larger ``epochs`` it trains on where that job stopped. It needs the process count
        (``num_gpus * num_nodes``) that wrote the checkpoint. Find the id of a checkpoint file
        downloaded earlier with ``client.checkpoints.find(sha256=...)``.
        """
        if config is None:
            config = TrainingConfig()
        elif not isinstance(config, TrainingConfig):
            config = TrainingConfig.model_validate(dict(config))
        body: dict[str, Any] = {
            "model_id": model_id,
            "dataset_id": dataset_id,
            "config": config.model_dump(mode="json"),
        }
        if validation_dataset_id is not None:
            body["validation_dataset_id"] = validation_dataset_id
        if model_kwargs:
            body["model_kwargs"] = dict(model_kwargs)
        if name is not None:
            body["name"] = name
        if resume_from_checkpoint is not None:
            body["resume_from_checkpoint"] = (
                resume_from_checkpoint.id
                if isinstance(resume_from_checkpoint, Checkpoint)
                else resume_from_checkpoint
            )
        response = self._http.request(
            "POST", "/v1/jobs", json_body=body, idempotency_key=idempotency_key
        )
        return Job.model_validate(response.json())

    def retrieve(self, job_id: str) -> Job:
        return Job.model_validate(self._http.request("GET", f"/v1/jobs/{job_id}").json())

    def list(
        self,
        *,
        state: JobState | str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> CursorPage[Job]:
        params = {"state": str(state) if state is not None else None, "limit": limit}
        return self._list("/v1/jobs", Job, params, cursor)

    def cancel(self, job_id: str) -> Job:
        """Ask the job to stop (idempotent: a finished job is returned as it is)."""
        response = self._http.request("POST", f"/v1/jobs/{job_id}/cancel", idempotent=True)
        return Job.model_validate(response.json())

    def metrics(
        self, job_id: str, *, since_step: int | None = None, name: str | None = None
    ) -> builtins.list[Metric]:
        """Every metric the job reported, ordered by step."""
        params = {"since_step": since_step, "name": name}
        payload = self._http.request("GET", f"/v1/jobs/{job_id}/metrics", params=params).json()
        return [Metric.model_validate(item) for item in payload.get("data") or []]

    def logs(self, job_id: str, *, after: int | None = None, limit: int | None = None) -> LogPage:
        """Log lines after sequence number ``after``; follow ``next_after`` for more."""
        params = {"after": after, "limit": limit}
        payload = self._http.request("GET", f"/v1/jobs/{job_id}/logs", params=params).json()
        lines = [LogLine.model_validate(item) for item in payload.get("data") or []]
        return LogPage(data=lines, next_after=payload.get("next_after"))

    def iter_logs(self, job_id: str, *, after: int | None = None) -> Iterator[LogLine]:
        """Every log line so far, page after page."""
        while True:
            page = self.logs(job_id, after=after)
            if not page.data:
                return
            yield from page.data
            if page.next_after is None or page.next_after == after:
                return
            after = page.next_after

    def checkpoints(self, job_id: str) -> builtins.list[Checkpoint]:
        payload = self._http.request("GET", f"/v1/jobs/{job_id}/checkpoints").json()
        return [Checkpoint.model_validate(item) for item in payload.get("data") or []]

    def download_checkpoint(
        self,
        job_id: str,
        checkpoint: str | Checkpoint,
        to: str | os.PathLike[str] = ".",
        *,
        verify: bool = True,
    ) -> Path:
        """Download a checkpoint file to ``to`` (a file path, or an existing directory to put
        it in under its own name) and return its path.

        With ``verify`` the sha256 is checked against the server's ``x-checksum-sha256`` (and
        the checkpoint's own, when a :class:`Checkpoint` is given); on a mismatch nothing is
        left behind and :class:`~ace3.errors.ChecksumMismatchError` is raised. The file
        appears only once complete.
        """
        checkpoint_id = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        expected = checkpoint.sha256 if isinstance(checkpoint, Checkpoint) else None
        target = Path(to)
        path = f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/content"
        with self._http.stream("GET", path) as response:
            if target.is_dir():
                name = checkpoint.name if isinstance(checkpoint, Checkpoint) else None
                if not name:
                    match = _FILENAME.search(response.headers.get("content-disposition", ""))
                    name = Path(match.group(1)).name if match else f"{checkpoint_id}.pt"
                target = target / name
            _write_verified(response, target, expected, verify=verify)
        return target

    def artifacts(self, job_id: str, *, prefix: str | None = None) -> builtins.list[Artifact]:
        """The job's artifacts (files it wrote under ``artifact://``), ordered by path; with
        ``prefix`` only that file or directory (``"tensorboard"``: ``tensorboard/...``)."""
        params = {"prefix": _artifact_path(prefix, "prefix") if prefix else None}
        payload = self._http.request("GET", f"/v1/jobs/{job_id}/artifacts", params=params).json()
        return [Artifact.model_validate(item) for item in payload.get("data") or []]

    def download_artifact(
        self,
        job_id: str,
        path: str | Artifact,
        destination: str | os.PathLike[str] = ".",
        *,
        verify: bool = True,
    ) -> Path:
        """Download one artifact to ``destination`` (a file path, or an existing directory to
        put it in under its own file name) and return where it was written.

        The file appears only once complete (a temporary file renamed over it). With
        ``verify`` its sha256 must match the server's ``x-checksum-sha256`` (and the
        :class:`Artifact`'s own when one is given, so a version replaced meanwhile is
        noticed); on a mismatch nothing is written and
        :class:`~ace3.errors.ChecksumMismatchError` is raised.
        """
        target, _ = self._download_artifact(job_id, path, destination, verify=verify)
        return target

    def _download_artifact(
        self,
        job_id: str,
        path: str | Artifact,
        destination: str | os.PathLike[str],
        *,
        verify: bool = True,
    ) -> tuple[Path, str]:
        """:meth:`download_artifact`, also returning the sha256 of the bytes written."""
        expected = path.sha256 if isinstance(path, Artifact) else None
        relative = _artifact_path(path.path if isinstance(path, Artifact) else path, "path")
        target = Path(destination)
        if target.is_dir():
            target = target / PurePosixPath(relative).name
        url = f"/v1/jobs/{job_id}/artifacts/{quote(relative, safe='/')}"
        with self._http.stream("GET", url) as response:
            digest = _write_verified(response, target, expected, verify=verify)
        return target, digest

    def events(
        self,
        job_id: str,
        *,
        metrics_after: int | None = None,
        logs_after: int | None = None,
        last_event_id: str | None = None,
        max_reconnects: int = 5,
        timeout: float | None = None,
    ) -> Iterator[JobEvent]:
        """Live events of a job until its ``end`` event, reconnecting (with
        ``Last-Event-ID``) when the connection drops. ``timeout`` (seconds) bounds the whole
        wait and raises ``TimeoutError``; the job itself keeps running."""

        def resume_params(resume_id: str) -> dict[str, Any]:
            match = _EVENT_ID.match(resume_id)
            return (
                dict(zip(("metrics_after", "logs_after"), match.groups(), strict=True))
                if match
                else {}
            )

        for event in follow_events(
            self._http,
            f"/v1/jobs/{job_id}/events",
            params={"metrics_after": metrics_after, "logs_after": logs_after},
            resume_params=resume_params,
            max_reconnects=max_reconnects,
            last_event_id=last_event_id,
            timeout=timeout,
        ):
            yield decode_event(event, _EVENT_MODELS, JobEvent)


_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


class Checkpoints(_Resource):
    """``/v1/checkpoints``: stored checkpoints across your jobs."""

    def find(self, *, sha256: str) -> builtins.list[Checkpoint]:
        """The stored checkpoints (of your jobs) whose file has this sha256, newest first:
        maps a checkpoint file downloaded earlier back to its id (and ``job_id``)."""
        if not isinstance(sha256, str) or not _SHA256.match(sha256):
            raise ValueError(
                f"sha256={sha256!r} is not a sha256: pass 64 hex digits, e.g. "
                "hashlib.sha256(Path(file).read_bytes()).hexdigest()"
            )
        payload = self._http.request(
            "GET", "/v1/checkpoints", params={"sha256": sha256.lower()}
        ).json()
        return [Checkpoint.model_validate(item) for item in payload.get("data") or []]

    def find_file(self, path: str | os.PathLike[str]) -> builtins.list[Checkpoint]:
        """:meth:`find` for a local checkpoint file (hashed here)."""
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        return self.find(sha256=digest.hexdigest())


class Workers(_Resource):
    """``/v1/workers``: the live workers of the cluster and their capacity."""

    def list(self) -> builtins.list[Worker]:
        """The workers that heartbeated recently, oldest first. A job fits a worker when its
        ``num_gpus`` is at most the worker's ``device_count`` and, for ``backend='nccl'``, the
        worker is a CUDA worker; the server refuses (422) a job that fits none of them."""
        payload = self._http.request("GET", "/v1/workers").json()
        return [Worker.model_validate(item) for item in payload.get("data") or []]
