"""A distillation job's teacher inputs: which stored rows they are (:func:`teacher_rows`, read
with the job's other inputs) and their copies in the attempt's directory (``teacher/``, read
only, verified against their sha256 like every input), described for ``job.json``'s
``teacher`` entry (:func:`copy_teacher`).

The teacher's model is a stored model (``config.distillation.teacher_model_id``), its weights
optionally stored weights (``teacher_checkpoint_id``: a checkpoint of one of the owner's jobs or
weights the owner uploaded, found like ``init_from_checkpoint_id``). Both were checked to belong
to the job's owner when the job was created; the weights are checked again here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy.orm import Session

from ace3_control.models import Job, StoredModel, fetch_sha256
from ace3_control.stored_weights import StoredWeights, required_weights

# Copies a stored file into the job directory: (storage key, target, sha256) -> the copy.
CopyStored = Callable[[str, Path, str | None], Path]


@dataclass(frozen=True)
class TeacherRows:
    """The stored model that builds the teacher and the checkpoint with its weights."""

    model: StoredModel
    checkpoint: StoredWeights | None
    model_kwargs: dict[str, Any]


def teacher_checkpoint(session: Session, job: Job, checkpoint_id: str) -> StoredWeights:
    """The owner's stored weights ``teacher_checkpoint_id`` names (refused when gone)."""
    return required_weights(session, job.owner_id, checkpoint_id, "the teacher's weights")


def teacher_rows(session: Session, job: Job) -> TeacherRows | None:
    """The job's teacher rows, or None for a job without distillation."""
    settings = (job.config or {}).get("distillation")
    if not settings:
        return None
    model_id = settings.get("teacher_model_id")
    model = session.get(StoredModel, model_id) if model_id else None
    if model is None or model.deleted_at is not None or model.owner_id != job.owner_id:
        raise FileNotFoundError(f"the teacher's model {model_id} is gone")
    checkpoint_id = settings.get("teacher_checkpoint_id")
    checkpoint = teacher_checkpoint(session, job, str(checkpoint_id)) if checkpoint_id else None
    return TeacherRows(model, checkpoint, dict(settings.get("teacher_model_kwargs") or {}))


def copy_teacher(
    rows: TeacherRows, into: Path, copy: CopyStored, visible: Callable[[Path], PurePosixPath]
) -> dict[str, Any]:
    """Copy the teacher's model code (and weights) under ``into``; its ``job.json`` entry."""
    model = rows.model
    code_name = "model.py" if model.kind == "file" else "package"
    code = copy(model.storage_key, into / "code" / code_name, fetch_sha256(model))
    spec: dict[str, Any] = {
        "model": {
            "path": str(visible(code)),
            "kind": model.kind,
            "entry_module": model.entry_module,
            "factory": model.factory,
            "kwargs": rows.model_kwargs,
        }
    }
    if rows.checkpoint is not None:
        checkpoint = rows.checkpoint
        weights = copy(
            checkpoint.storage_key, into / "weights" / checkpoint.name, checkpoint.sha256
        )
        spec["checkpoint"] = str(visible(weights))
        spec["checkpoint_sha256"] = checkpoint.sha256
    return spec
