"""``client.jobs``: submit training jobs, read their metrics, logs, checkpoints and artifacts
(downloads are streamed to a temporary file and verified before they are renamed into place),
and follow their live events."""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from ace3.client._sse import decode_event, follow_events
from ace3.config import TrainingConfig
from ace3.config.events import EVAL_SAMPLES_PAGE
from ace3.config.specs import ARTIFACT_SCHEME
from ace3.files import sha256_file

if TYPE_CHECKING:
    pass

from ace3.client._download import download_checkpoint_file, write_verified
from ace3.client._resource import _Runs
from ace3.client.types import (
    _EVENT_MODELS,
    Artifact,
    Checkpoint,
    Job,
    JobEvent,
    JobRecord,
    LogLine,
    LogPage,
    Metric,
    RecordPage,
)


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


_EVENT_ID = re.compile(r"^(\d+):(\d+)(?::(\d+))?$")


def with_uploaded_weights(config: TrainingConfig, http: Any) -> TrainingConfig:
    """``config`` with its local weights files (``init_from``, a distillation teacher's
    ``teacher_checkpoint``: ``.safetensors`` files) uploaded and sent by id: the service never
    sees a local path. (``ace3.Trainer`` also converts ``.pt`` files.)"""
    from ace3.client.resources import Checkpoints

    if config.init_from is not None:
        uploaded = Checkpoints(http).upload(Path(config.init_from).expanduser())
        config = config.model_copy(
            update={"init_from": None, "init_from_checkpoint_id": uploaded.id}
        )
    teacher = config.distillation
    if teacher is not None and teacher.teacher_checkpoint_path is not None:
        uploaded = Checkpoints(http).upload(Path(teacher.teacher_checkpoint_path).expanduser())
        weights = {"teacher_checkpoint_path": None, "teacher_checkpoint_id": uploaded.id}
        config = config.model_copy(update={"distillation": teacher.model_copy(update=weights)})
    return config


class Jobs(_Runs[Job]):
    """``/v1/jobs``: training jobs, their metrics, logs, checkpoints and live events."""

    _path = "/v1/jobs"
    _run_type = Job

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
        priority: str | None = None,
    ) -> Job:
        """Submit a job. With an ``idempotency_key`` the request is retried safely (the same
        key on every attempt) and a repeat returns the job created the first time.

        ``resume_from_checkpoint`` (a :class:`Checkpoint` or its id, of any of your jobs) starts
        the job from that checkpoint: its weights, optimizer state, step and epoch, so with a
        larger ``epochs`` it trains on where that job stopped. It needs the process count
        (``num_gpus * num_nodes``) that wrote the checkpoint. Find the id of a checkpoint file
        downloaded earlier with ``client.checkpoints.find(sha256=...)``.

        ``priority`` (``"high"``, ``"normal"``, the default, or ``"low"``) orders the claims of
        queued jobs; owners take turns within one (and their quotas hold).
        """
        if config is None:
            config = TrainingConfig()
        elif not isinstance(config, TrainingConfig):
            config = TrainingConfig.model_validate(dict(config))
        if isinstance(resume_from_checkpoint, Checkpoint):
            resume_from_checkpoint = resume_from_checkpoint.id
        config = with_uploaded_weights(config, self._http)
        return self._create(
            model_id=model_id,
            dataset_id=dataset_id,
            config=config.model_dump(mode="json", exclude_unset=True),  # what was set
            validation_dataset_id=validation_dataset_id,
            model_kwargs=model_kwargs,
            name=name,
            idempotency_key=idempotency_key,
            resume_from_checkpoint=resume_from_checkpoint,
            priority=priority,
        )

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

    def record_page(
        self,
        job_id: str,
        *,
        type: str | None = None,
        after: int | None = None,
        limit: int | None = None,
        order: Literal["oldest", "newest"] | None = None,
    ) -> RecordPage:
        """One page of the job's typed records after id ``after`` (``type``:
        ``"instability"``, ``"preempted"`` or ``"eval_samples"``; None: all), oldest first;
        follow ``next_after`` for more. ``order="newest"``: the newest ``limit`` first
        (``limit=1``: the latest one). A page that may hold eval_samples records (each up to
        256 KiB) holds at most :data:`~ace3.config.events.EVAL_SAMPLES_PAGE`."""
        params = {"type": type, "after": after, "limit": limit, "order": order}
        payload = self._http.request("GET", f"/v1/jobs/{job_id}/records", params=params).json()
        records = [JobRecord.model_validate(item) for item in payload.get("data") or []]
        return RecordPage(data=records, next_after=payload.get("next_after"))

    def records(
        self,
        job_id: str,
        *,
        type: str | None = None,
        after: int | None = None,
    ) -> builtins.list[JobRecord]:
        """Every typed record the job reported so far, oldest first: the instability guard's
        (``type="instability"``, each ``record`` an
        :class:`~ace3.config.events.InstabilityRecord`), preemptions (``"preempted"``,
        :class:`~ace3.config.events.PreemptedRecord`) and the completions of ``eval_prompts``
        (``"eval_samples"``, :class:`~ace3.config.events.EvalSamplesRecord`). The service keeps
        at most 1000 an attempt (of eval_samples, the newest 100). Read page by page (pages
        that may hold eval_samples records: :data:`~ace3.config.events.EVAL_SAMPLES_PAGE`
        records each)."""
        found: builtins.list[JobRecord] = []
        limit = EVAL_SAMPLES_PAGE if type in (None, "eval_samples") else None
        while True:
            page = self.record_page(job_id, type=type, after=after, limit=limit)
            found += page.data
            if not page.data or page.next_after is None or page.next_after == after:
                return found
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
        return download_checkpoint_file(
            self._http,
            f"/v1/jobs/{job_id}/checkpoints/{checkpoint_id}/content",
            Path(to),
            checkpoint_id=checkpoint_id,
            name=checkpoint.name if isinstance(checkpoint, Checkpoint) else None,
            expected=checkpoint.sha256 if isinstance(checkpoint, Checkpoint) else None,
            verify=verify,
        )

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

    def download_artifacts(
        self,
        job_id: str,
        directory: str | os.PathLike[str],
        *,
        prefix: str | None = None,
        verify: bool = True,
    ) -> builtins.list[Path]:
        """Download every artifact of the job (with ``prefix``, that file or directory only)
        into ``directory``, keeping their relative paths (``directory/huggingface/config.json``),
        and return the paths, in the listing's order.

        Each file appears only once complete and (with ``verify``) checked as by
        :meth:`download_artifact`; a file already there with the artifact's sha256 is kept (a
        download cut short resumes where it stopped). Nothing is written through a symbolic
        link: a path in ``directory`` that is one is refused with ``ValueError`` (a job names
        its own artifact paths).
        """
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        inside = root.resolve()
        written: builtins.list[Path] = []
        for artifact in self.artifacts(job_id, prefix=prefix):
            relative = _artifact_path(artifact.path, "path")
            target = root
            for part in relative.split("/"):
                target = target / part
                if target.is_symlink():
                    raise ValueError(
                        f"{target} is a symbolic link: artifacts are never written through one "
                        f"(artifact {relative!r} of job {job_id})"
                    )
            if not target.resolve().is_relative_to(inside):  # (a drive, "D:", on Windows)
                raise ValueError(
                    f"artifact {relative!r} of job {job_id} would be written outside {root}"
                )
            target.parent.mkdir(parents=True, exist_ok=True)
            if not (target.is_file() and sha256_file(target) == artifact.sha256):
                self._download_artifact(job_id, artifact, target, verify=verify)
            written.append(target)
        return written

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
            digest = write_verified(response, target, expected, verify=verify)
        return target, digest

    def events(
        self,
        job_id: str,
        *,
        metrics_after: int | None = None,
        logs_after: int | None = None,
        records_after: int | None = None,
        last_event_id: str | None = None,
        max_reconnects: int = 5,
        timeout: float | None = None,
    ) -> Iterator[JobEvent]:
        """Live events of a job until its ``end`` event, reconnecting (with
        ``Last-Event-ID``) when the connection drops. ``timeout`` (seconds) bounds the whole
        wait and raises ``TimeoutError``; the job itself keeps running."""

        def resume_params(resume_id: str) -> dict[str, Any]:
            match = _EVENT_ID.match(resume_id)
            if match is None:
                return {}
            names = ("metrics_after", "logs_after", "records_after")
            return {name: value or "0" for name, value in zip(names, match.groups(), strict=True)}

        for event in follow_events(
            self._http,
            f"/v1/jobs/{job_id}/events",
            params={
                "metrics_after": metrics_after,
                "logs_after": logs_after,
                "records_after": records_after,
            },
            resume_params=resume_params,
            max_reconnects=max_reconnects,
            last_event_id=last_event_id,
            timeout=timeout,
        ):
            yield decode_event(event, _EVENT_MODELS, JobEvent)
