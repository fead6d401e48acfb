"""A succeeded run's exported model registered as a new model of the job's owner.

A job on a Hugging Face model (``kind: "huggingface"``) writes the trained model under
``artifacts/huggingface/`` at its end (``ace3.runtime.hf_export``), which the artifact sync has
copied into the store (``job_artifacts`` rows, each file hashed) before the outcome is decided.
When such an attempt succeeds, :meth:`ExportRegistrar.prepare` (outside any transaction, while
the attempt's lease is kept alive) fetches those stored copies (not the job's own directory,
which the job could still have changed), checks the directory with the rules an upload of it
meets (``ace3_control.hf_model_dir``: never built, never imported here) and stores it as a tree
the way the API stores an uploaded model directory. :meth:`ExportRegistrar.add` then adds the
model row to the session that marks the job ``succeeded`` with ``fine_tuned_model_id``: a job
never reads ``succeeded`` without the model it made, and a fenced-out attempt adds no row (its
tree, content-addressed, stays for the next registration of the same bytes).

The same bytes exported twice for one owner are one model (its row is reused, or revived when
it was deleted). An upload is keyed by its archive's sha256 instead, so an uploaded directory
and an export of the same files are two rows.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ace3_control.check_errors import UploadCheckError
from ace3_control.hf_model_dir import (
    CONFIG,
    FROM_PRETRAINED,
    HUGGINGFACE,
    VARIANT,
    check_hf_model,
    is_hf_model_dir,
    stored_tree_key,
)
from ace3_control.models import Job, JobArtifact, StoredModel
from ace3_control.models.base import utcnow
from ace3_control.storage import ArtifactStore, tree_digest
from ace3_control.storage.base import StoredDigestError

EXPORT_DIR = "huggingface"  # under artifacts/, as ace3.runtime.hf_export writes it
MAX_NAME_CHARS = 200


class ExportError(Exception):
    """The run's export cannot be registered as a model; the message says why."""


class StoreOutage(Exception):
    """The artifact store failed while the export was read or stored: retried like a database
    outage (then left to the reconciler, whose next attempt resumes and exports again)."""


@dataclass(frozen=True)
class PreparedExport:
    """A checked export, stored as a tree under ``key``, waiting for its row."""

    job_id: str
    owner_id: str
    name: str
    digest: str
    key: str
    size_bytes: int
    fields: dict[str, Any]


def model_name(base_name: str, job_id: str, request: dict[str, Any] | None) -> str:
    """``<base>-<suffix>-<job id>``: the suffix a fine-tuning request named, else ``ft``."""
    suffix = (request or {}).get("suffix")
    tail = f"-{suffix if isinstance(suffix, str) and suffix else 'ft'}-{job_id}"
    return base_name[: max(1, MAX_NAME_CHARS - len(tail))] + tail


def export_paths(paths: list[str]) -> list[PurePosixPath]:
    """The export's files as paths inside it; ExportError for anything but plain relative
    parts, or a path that is a file and a directory at once."""
    relative = []
    for path in paths:
        inside = PurePosixPath(path.removeprefix(f"{EXPORT_DIR}/"))
        if inside.is_absolute() or any(part in ("", ".", "..") for part in inside.parts):
            raise ExportError(f"{path}: not a plain relative path")
        relative.append(inside)
    files = set(relative)
    for inside in relative:
        for parent in inside.parents:
            if parent in files:
                raise ExportError(f"{EXPORT_DIR}/{parent} is both a file and a directory")
    return relative


class ExportRegistrar:
    """Registers succeeded runs' exports for one worker process."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store

    def prepare(self, sessions: sessionmaker[Session], job_id: str) -> PreparedExport | None:
        """The job's export checked and stored; None when the job trains no Hugging Face
        model. ExportError when the export cannot be a model (its reason); StoreOutage when the
        store failed."""
        with sessions() as session:
            job = session.get(Job, job_id)
            base = None if job is None else session.get(StoredModel, job.model_id)
            if job is None or base is None or base.kind != HUGGINGFACE:
                return None
            prefix = f"{EXPORT_DIR}/"
            rows = session.scalars(
                select(JobArtifact)
                .where(JobArtifact.job_id == job_id, JobArtifact.path.startswith(prefix))
                .order_by(JobArtifact.path)
            ).all()
            files = [
                (row.path, row.storage_key, row.sha256, row.size_bytes)
                for row in rows
                if row.path.startswith(prefix)  # (SQLite's LIKE ignores case)
            ]
            owner_id, request = job.owner_id, job.fine_tune_request
            name = model_name(base.name, job_id, request)
        if not files:
            raise ExportError(
                f"the run stored no {EXPORT_DIR}/ export (its log says why: an artifact cap?)"
            )
        staging = Path(tempfile.mkdtemp(dir=self.store.staging_dir(), prefix="export-"))
        try:
            tree = staging / "tree"
            tree.mkdir()
            self._fetch(files, tree)
            described = self._check(tree)
            digest = tree_digest(tree)
            key = stored_tree_key(owner_id, digest)
            try:
                if not self.store.exists(key):  # (content-addressed: the same bytes are there)
                    self.store.put_file(key, tree)
            except Exception as exc:
                raise StoreOutage(f"storing the export: {exc}") from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        fields = {
            "architectures": described.architectures,
            "parameter_count": described.parameter_count,
            "module_names": described.module_names,
            "hf_config": described.summary(),
        }
        size = sum(size for _, _, _, size in files)
        return PreparedExport(job_id, owner_id, name, digest, key, size, fields)

    def _fetch(self, files: list[tuple[str, str, str, int]], tree: Path) -> None:
        """Copy the stored export into ``tree``, each file checked against its sha256."""
        for (path, key, sha256, _), inside in zip(
            files, export_paths([path for path, *_ in files]), strict=True
        ):
            target = tree.joinpath(*inside.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.store.fetch(key, target, sha256=sha256)
            except (FileNotFoundError, StoredDigestError) as exc:
                raise ExportError(f"{path}: {exc}") from None
            except Exception as exc:
                raise StoreOutage(f"reading {path}: {exc}") from exc

    @staticmethod
    def _check(tree: Path) -> Any:
        """The upload's checks on the tree; ExportError naming what is wrong, by its path in the
        export (never the worker's)."""
        if not is_hf_model_dir(tree):
            raise ExportError(f"no {CONFIG} at the top of {EXPORT_DIR}/")
        try:
            return check_hf_model(tree)
        except UploadCheckError as exc:
            raise ExportError(str(exc)) from None
        except OSError as exc:  # (a file where a directory should be, ...: the job wrote it)
            where = Path(exc.filename).relative_to(tree) if exc.filename else EXPORT_DIR
            raise ExportError(f"{EXPORT_DIR}/{where}: {exc.strerror or exc}") from None

    def add(self, session: Session, prepared: PreparedExport) -> str:
        """The model row of ``prepared`` in ``session`` (flushed, not committed): the owner's
        live row of the same bytes, else a deleted one revived, else a new one."""
        existing = session.scalar(
            select(StoredModel).where(
                StoredModel.owner_id == prepared.owner_id,
                StoredModel.sha256 == prepared.digest,
                StoredModel.variant == VARIANT,
            )
        )
        if existing is not None and existing.deleted_at is None:
            return existing.id
        if existing is not None:  # deleted: its bytes were freed, stored again now
            existing.deleted_at = None
            existing.created_at = utcnow()
            existing.name = prepared.name
            existing.storage_key = prepared.key
            existing.tree_sha256 = prepared.digest
            existing.source_job_id = prepared.job_id
            session.flush()
            return existing.id
        row = StoredModel(
            owner_id=prepared.owner_id,
            name=prepared.name,
            filename=EXPORT_DIR,
            kind=HUGGINGFACE,
            entry_module=None,
            factory=FROM_PRETRAINED,
            variant=VARIANT,
            sha256=prepared.digest,
            size_bytes=prepared.size_bytes,
            storage_key=prepared.key,
            tree_sha256=prepared.digest,
            requirements=None,
            forward_signature=None,
            source_job_id=prepared.job_id,
            **prepared.fields,
        )
        session.add(row)
        session.flush()
        return row.id
