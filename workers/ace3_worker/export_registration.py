"""A succeeded run's exported model registered as a new model of the job's owner.

A job on a Hugging Face model (``kind: "huggingface"``) writes the trained model under
``artifacts/huggingface/`` at its end (``ace3.runtime.hf_export``), which the artifact sync has
copied into the store (``job_artifacts`` rows, each file hashed) before the outcome is decided.
When such an attempt succeeds, :meth:`ExportRegistrar.register` fetches those stored copies (not
the job's own directory, which the job could still have changed), checks the directory with the
rules an upload of it meets (``ace3_control.hf_model_dir``: never built, never imported here),
stores it as a tree the way the API stores an uploaded model directory, and adds the model row
to the caller's session, which marks the job ``succeeded`` with ``fine_tuned_model_id`` in the
same transaction: a job never reads ``succeeded`` without the model it made, and a fenced-out
attempt registers nothing.

The same bytes already registered for the owner are the same model (its row is reused, or
revived when it was deleted), as an upload of the same bytes would be.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sqlalchemy import select
from sqlalchemy.orm import Session

from ace3_control.check_errors import UploadCheckError
from ace3_control.hf_model_dir import check_hf_model
from ace3_control.models import Job, JobArtifact, StoredModel
from ace3_control.models.base import utcnow
from ace3_control.storage import ArtifactStore, tree_digest
from ace3_control.storage.base import StoredDigestError

EXPORT_DIR = "huggingface"  # under artifacts/, as ace3.runtime.hf_export writes it
HUGGINGFACE = "huggingface"
FROM_PRETRAINED = "from_pretrained"
# The variant an uploaded model directory records (ace3_server.services.hf_models): the same
# tree uploaded or exported is one model.
VARIANT = f"{FROM_PRETRAINED}|"
MAX_NAME_CHARS = 200


class ExportError(Exception):
    """The run's export cannot be registered as a model; the message says why."""


@dataclass(frozen=True)
class Registered:
    """The model a run's export is, added to the session; ``new_key``: the store key this
    registration wrote, which nothing else names if the transaction is rolled back."""

    model_id: str
    new_key: str | None


def export_files(session: Session, job_id: str) -> list[JobArtifact]:
    """The job's stored artifacts under ``huggingface/``, by path."""
    prefix = f"{EXPORT_DIR}/"
    rows = session.scalars(
        select(JobArtifact)
        .where(JobArtifact.job_id == job_id, JobArtifact.path.startswith(prefix, autoescape=True))
        .order_by(JobArtifact.path)
    )
    return list(rows)


def _relative(path: str) -> PurePosixPath:
    """An artifact's path inside the export; ExportError for anything but plain parts."""
    relative = PurePosixPath(path.removeprefix(f"{EXPORT_DIR}/"))
    if relative.is_absolute() or any(part in ("", ".", "..") for part in relative.parts):
        raise ExportError(f"{path}: not a plain relative path")
    return relative


def model_name(base_name: str, job: Job) -> str:
    """``<base>-<suffix>-<job id>``: the suffix a fine-tuning request named, else ``ft``."""
    request = job.fine_tune_request or {}
    suffix = request.get("suffix") if isinstance(request.get("suffix"), str) else None
    tail = f"-{suffix or 'ft'}-{job.id}"
    return base_name[: max(1, MAX_NAME_CHARS - len(tail))] + tail


class ExportRegistrar:
    """Registers succeeded runs' exports for one worker process."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store

    def register(self, session: Session, job_id: str) -> Registered | None:
        """The model the job's export is (added to ``session``, not committed); None when the
        job trains no Hugging Face model or exported nothing. ExportError when the export
        cannot be a model (its reason)."""
        job = session.get(Job, job_id)
        base = None if job is None else session.get(StoredModel, job.model_id)
        if job is None or base is None or base.kind != HUGGINGFACE:
            return None
        files = export_files(session, job_id)
        if not files:
            return None
        staging = Path(tempfile.mkdtemp(dir=self.store.staging_dir(), prefix="export-"))
        try:
            tree = staging / "tree"
            tree.mkdir()
            size = self._fetch(files, tree)
            try:
                described = check_hf_model(tree)
            except UploadCheckError as exc:
                raise ExportError(str(exc)) from None
            digest = tree_digest(tree)
            key = self._key(job.owner_id, digest)
            existing = session.scalar(
                select(StoredModel).where(
                    StoredModel.owner_id == job.owner_id,
                    StoredModel.sha256 == digest,
                    StoredModel.variant == VARIANT,
                )
            )
            if existing is not None and existing.deleted_at is None:
                return Registered(existing.id, None)
            try:
                self.store.put_file(key, tree)  # (moves the tree; one already there is kept)
            except Exception as exc:  # (a store outage or a full disk: said, not retried)
                raise ExportError(f"the artifact store could not store it: {exc}") from exc
            name = model_name(base.name, job)
            if existing is not None:  # deleted: its bytes were freed, stored again now
                existing.deleted_at = None
                existing.created_at = utcnow()
                existing.name = name
                existing.storage_key = key
                existing.tree_sha256 = digest
                existing.source_job_id = job.id
                session.flush()
                return Registered(existing.id, key)
            row = StoredModel(
                owner_id=job.owner_id,
                name=name,
                filename=EXPORT_DIR,
                kind=HUGGINGFACE,
                entry_module=None,
                factory=FROM_PRETRAINED,
                variant=VARIANT,
                sha256=digest,
                size_bytes=size,
                storage_key=key,
                tree_sha256=digest,
                requirements=None,
                forward_signature=None,
                architectures=described.architectures,
                parameter_count=described.parameter_count,
                module_names=described.module_names,
                hf_config=described.summary(),
                source_job_id=job.id,
            )
            session.add(row)
            session.flush()
            return Registered(row.id, key)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _fetch(self, files: list[JobArtifact], tree: Path) -> int:
        """Copy the stored export into ``tree``, each file checked against its recorded sha256;
        the bytes copied."""
        size = 0
        for row in files:
            target = tree.joinpath(*_relative(row.path).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.store.fetch(row.storage_key, target, sha256=row.sha256)
            except (FileNotFoundError, StoredDigestError) as exc:
                raise ExportError(f"{row.path}: {exc}") from None
            except Exception as exc:  # (a store outage or a full disk: said, not retried)
                raise ExportError(f"{row.path}: the artifact store failed: {exc}") from exc
            size += row.size_bytes
        return size

    @staticmethod
    def _key(owner_id: str, digest: str) -> str:
        variant_digest = hashlib.sha256(VARIANT.encode()).hexdigest()[:16]
        return f"models/{owner_id}/{digest}-{variant_digest}/tree"

    def discard(self, session: Session, registered: Registered | None) -> None:
        """Remove the tree a rolled-back registration stored, unless a row (another job's
        registration of the same bytes, committed meanwhile) names it."""
        if registered is None or registered.new_key is None:
            return
        named = session.scalar(
            select(StoredModel.id).where(StoredModel.storage_key == registered.new_key).limit(1)
        )
        if named is None:
            self.store.delete(registered.new_key)
