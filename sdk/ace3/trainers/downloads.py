"""Local copies of what a remote job writes, kept up to date while it runs.

- :class:`ArtifactSync` copies the job's artifacts (files it writes under ``artifact://``
  paths: TensorBoard event files, profiler traces, ModelCheckpoint files) into local
  directories, one per artifact path prefix.
- :class:`CheckpointSync` copies each new checkpoint of the job into a local directory, keeping
  the newest ``max_checkpoints`` there.

Both are polled: call :meth:`~ArtifactSync.sync` every few seconds while the job runs (or
:meth:`~ArtifactSync.maybe_sync` on every event, which syncs at most every
``min_interval_seconds``), and once more after the job ended. A file appears locally only once
complete and checked against its sha256. An error (the network, a file replaced mid-download)
is kept in ``errors`` and the file is retried on the next call; nothing is raised unless
``raise_errors=True``.
"""

from __future__ import annotations

import abc
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import httpx

from ace3.client.types import Artifact, Checkpoint
from ace3.config.specs import ARTIFACT_SCHEME
from ace3.errors import ACE3Error
from ace3.files import sha256_file

if TYPE_CHECKING:
    from ace3.client import Client

__all__ = ["ArtifactSync", "CheckpointSync"]

logger = logging.getLogger(__name__)

DEFAULT_MIN_INTERVAL_SECONDS = 2.0
# What a sync pass rides out and retries next time (ACE3Error covers HTTP statuses, lost
# connections and checksum mismatches; httpx errors can surface while a body streams).
RETRIED_ERRORS = (ACE3Error, OSError, httpx.HTTPError)


def _already_there(target: Path, size_bytes: int | None, sha256: str | None) -> bool:
    """The local file holds these bytes already (a sync restarted after a crash)."""
    try:
        if not target.is_file() or sha256 is None:
            return False
        if size_bytes is not None and target.stat().st_size != size_bytes:
            return False
        return sha256_file(target) == sha256
    except OSError:
        return False


def _normalized_prefix(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"a mapping key must be a str (an artifact path prefix), not {prefix!r}")
    text = prefix.removeprefix(ARTIFACT_SCHEME).strip("/")
    if any(part in (".", "..") for part in text.split("/")) or "//" in text:
        raise ValueError(
            f"mapping key {prefix!r} is not an artifact path prefix: use e.g. 'tensorboard' "
            "or 'artifact://profiler' (no '.', '..' or empty segments)"
        )
    return text


def _safe_relative(relative: str) -> PurePosixPath | None:
    """``relative`` as a path that stays inside a local directory, or None."""
    parts = relative.split("/")
    if not relative or any(part in ("", ".", "..") for part in parts) or "\\" in relative:
        return None
    return PurePosixPath(*parts)


class _Throttled(abc.ABC):
    """``maybe_sync``: sync at most every ``min_interval_seconds``."""

    min_interval_seconds: float
    _last_sync: float | None

    @abc.abstractmethod
    def sync(self, *, raise_errors: bool = False) -> list[Path]:
        """One pass; the local paths written."""

    def maybe_sync(self) -> list[Path]:
        """:meth:`sync` when the last one is ``min_interval_seconds`` old, else nothing."""
        now = time.monotonic()
        if self._last_sync is not None and now - self._last_sync < self.min_interval_seconds:
            return []
        self._last_sync = now
        return self.sync()


class ArtifactSync(_Throttled):
    """Copies a job's artifacts to local directories.

    ``mapping``: artifact path prefix -> local directory. An artifact under a prefix is written
    to ``local_dir / <its path below the prefix>`` (an artifact that *is* the prefix, a single
    file, to ``local_dir / <its file name>``); the longest matching prefix wins; artifacts under
    no prefix are left alone. ``""`` maps every artifact. Prefixes may start with
    ``artifact://``. For example ``{"tensorboard": Path("./tensorboard_logs")}`` mirrors the
    job's ``artifact://tensorboard`` directory into ``./tensorboard_logs``.
    """

    def __init__(
        self,
        client: Client,
        job_id: str,
        mapping: Mapping[str, str | os.PathLike[str]],
        *,
        min_interval_seconds: float = DEFAULT_MIN_INTERVAL_SECONDS,
    ) -> None:
        if not isinstance(mapping, Mapping):
            raise TypeError(
                "mapping must be a dict of artifact path prefix -> local directory, e.g. "
                "{'tensorboard': Path('./tensorboard_logs')}"
            )
        self._client = client
        self.job_id = job_id
        self.mapping: dict[str, Path] = {
            _normalized_prefix(prefix): Path(local_dir) for prefix, local_dir in mapping.items()
        }
        self.min_interval_seconds = min_interval_seconds
        self._last_sync: float | None = None
        self._synced: dict[str, str] = {}  # artifact path -> sha256 of the local copy
        self.errors: list[Exception] = []

    def local_path(self, artifact_path: str) -> Path | None:
        """Where ``artifact_path`` goes locally, or None (under no prefix, or unsafe)."""
        best: str | None = None
        for prefix in self.mapping:
            matches = (
                prefix == "" or artifact_path == prefix or artifact_path.startswith(prefix + "/")
            )
            if matches and (best is None or len(prefix) > len(best)):
                best = prefix
        if best is None:
            return None
        relative = _safe_relative(artifact_path)
        if relative is None:
            return None
        if artifact_path == best:
            return self.mapping[best] / relative.name
        below = relative.relative_to(best) if best else relative
        return self.mapping[best] / below

    def sync(self, *, raise_errors: bool = False) -> list[Path]:
        """Download every mapped artifact whose bytes changed since the last sync; return the
        local paths written."""
        self.errors = []
        try:
            artifacts = self._client.jobs.artifacts(self.job_id)
        except RETRIED_ERRORS as exc:
            return self._failed(exc, raise_errors)
        written: list[Path] = []
        for artifact in artifacts:
            target = self.local_path(artifact.path)
            if target is None or self._synced.get(artifact.path) == artifact.sha256:
                continue
            if _already_there(target, artifact.size_bytes, artifact.sha256):
                self._synced[artifact.path] = artifact.sha256
                continue
            written += self._download(artifact, target)
        if raise_errors and self.errors:
            raise self.errors[0]
        return written

    def _download(self, artifact: Artifact, target: Path) -> list[Path]:
        try:
            # Checked against the bytes' own announced sha256: when a newer version replaced
            # the listed one meanwhile, that one is written and recorded.
            path, digest = self._client.jobs._download_artifact(self.job_id, artifact.path, target)
        except RETRIED_ERRORS as exc:
            logger.debug("artifact %s of job %s: %s", artifact.path, self.job_id, exc)
            self.errors.append(exc)
            return []
        self._synced[artifact.path] = digest
        return [path]

    def _failed(self, exc: Exception, raise_errors: bool) -> list[Path]:
        logger.debug("listing the artifacts of job %s: %s", self.job_id, exc)
        self.errors.append(exc)
        if raise_errors:
            raise exc
        return []


class CheckpointSync(_Throttled):
    """Copies each new checkpoint of a job into ``local_dir`` under its own name.

    Every checkpoint the service lists was verified against its sha256 when it was stored, and
    the download is verified again. With ``max_checkpoints`` only the newest N are kept
    locally (older ones this object downloaded are deleted; other files in ``local_dir`` are
    never touched, and the newest checkpoint is never deleted), and checkpoints already older
    than the newest N are not downloaded at all.
    """

    def __init__(
        self,
        client: Client,
        job_id: str,
        local_dir: str | os.PathLike[str],
        max_checkpoints: int | None = None,
        *,
        min_interval_seconds: float = DEFAULT_MIN_INTERVAL_SECONDS,
    ) -> None:
        if max_checkpoints is not None and (
            isinstance(max_checkpoints, bool)
            or not isinstance(max_checkpoints, int)
            or max_checkpoints < 1
        ):
            raise ValueError(
                f"max_checkpoints={max_checkpoints!r}: pass a whole number >= 1 (how many of "
                "the newest checkpoints to keep locally), or None to keep all"
            )
        self._client = client
        self.job_id = job_id
        self.local_dir = Path(local_dir)
        self.max_checkpoints = max_checkpoints
        self._best_ids: set[str] = set()
        self.min_interval_seconds = min_interval_seconds
        self._last_sync: float | None = None
        self._local: dict[str, tuple[tuple[int, str], Path]] = {}  # id -> (order key, path)
        self._pruned: set[str] = set()
        self.errors: list[Exception] = []

    @property
    def local_checkpoints(self) -> list[Path]:
        """The checkpoint files this object keeps, oldest first."""
        return [path for _, path in sorted(self._local.values())]

    def sync(self, *, raise_errors: bool = False) -> list[Path]:
        """Download the checkpoints not copied yet, prune to ``max_checkpoints``; return the
        local paths written."""
        self.errors = []
        try:
            checkpoints = self._client.jobs.checkpoints(self.job_id)
        except RETRIED_ERRORS as exc:
            self.errors.append(exc)
            if raise_errors:
                raise
            return []
        ordered = sorted(checkpoints, key=_order)
        wanted = ordered[-self.max_checkpoints :] if self.max_checkpoints else ordered
        best = [item for item in ordered if item.best]  # kept beside the newest N
        self._best_ids = {item.id for item in best}
        wanted = [item for item in ordered if item in best or item in wanted]
        written: list[Path] = []
        for checkpoint in wanted:
            if checkpoint.id in self._local or checkpoint.id in self._pruned:
                continue
            target = self.local_dir / (Path(checkpoint.name).name or f"{checkpoint.id}.pt")
            if not _already_there(target, checkpoint.size_bytes, checkpoint.sha256):
                try:
                    self._client.jobs.download_checkpoint(self.job_id, checkpoint, target)
                except RETRIED_ERRORS as exc:
                    logger.debug("checkpoint %s of job %s: %s", checkpoint.id, self.job_id, exc)
                    self.errors.append(exc)
                    continue
                written.append(target)
            self._local[checkpoint.id] = (_order(checkpoint), target)
        self._prune()
        if raise_errors and self.errors:
            raise self.errors[0]
        return written

    def _prune(self) -> None:
        """Keep the newest ``max_checkpoints`` local copies (always the newest one) and the
        best one (``keep_best_checkpoint``)."""
        if not self.max_checkpoints or len(self._local) <= self.max_checkpoints:
            return
        by_age = sorted(self._local.items(), key=lambda item: item[1][0])
        kept = by_age[-self.max_checkpoints :]
        kept += [item for item in by_age if item[0] in self._best_ids]
        keep_paths = {path for _, (_, path) in kept}
        for checkpoint_id, (_, path) in by_age[: -self.max_checkpoints]:
            if checkpoint_id in self._best_ids:
                continue
            if path not in keep_paths:  # a newer checkpoint may reuse the name
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    self.errors.append(exc)
                    continue
            del self._local[checkpoint_id]
            self._pruned.add(checkpoint_id)


def _order(checkpoint: Checkpoint) -> tuple[int, str]:
    created = checkpoint.created_at.isoformat() if checkpoint.created_at else ""
    return (checkpoint.step or 0, created)
