"""Materialises a job attempt into its own directory: code, data, the job file, an output dir.

The runtime reads only ``job.json``; every path in it points inside this directory (data and code
are links into the artifact store, which workers share). The layout is documented in
docs/runtime.md.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ace3_server.models import Job, JobCheckpoint, StoredDataset, StoredModel
from ace3_server.storage import LocalArtifactStore


@dataclass
class JobDirectory:
    root: Path

    @property
    def job_file(self) -> Path:
        return self.root / "job.json"

    @property
    def output_dir(self) -> Path:
        return self.root / "output"

    @property
    def events_file(self) -> Path:
        return self.output_dir / "events.jsonl"

    @property
    def artifacts_dir(self) -> Path:
        """Files the job writes here are synced to the artifact store while it runs
        (``artifact://`` paths in the job config name this directory)."""
        return self.output_dir / "artifacts"


def _link(target: Path, link: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=target.is_dir())
    return link


def _dataset_spec(store: LocalArtifactStore, dataset: StoredDataset, into: Path) -> dict[str, Any]:
    source = store.path_for(dataset.storage_key)
    if not source.exists():
        raise FileNotFoundError(
            f"dataset {dataset.id} ({dataset.filename}) is missing from storage"
        )
    name = "tree" if dataset.kind == "directory" else f"data{source.suffix}"
    return {"path": str(_link(source, into / name))}


def prepare_job_directory(
    work_dir: Path,
    store: LocalArtifactStore,
    job: Job,
    attempt: int,
    model: StoredModel,
    dataset: StoredDataset,
    validation_dataset: StoredDataset | None,
    resume_from: JobCheckpoint | None,
    node_rank: int | None = None,
) -> JobDirectory:
    """``<work_dir>/<job>/attempt-<n>``; one node of a multi-node job gets ``attempt-<n>-node-<k>``
    (workers on one machine may share a work directory)."""
    name = f"attempt-{attempt}" if node_rank is None else f"attempt-{attempt}-node-{node_rank}"
    directory = JobDirectory(work_dir / job.id / name)
    if directory.root.exists():
        shutil.rmtree(directory.root)
    directory.output_dir.mkdir(parents=True)
    directory.artifacts_dir.mkdir()

    model_source = store.path_for(model.storage_key)
    if not model_source.exists():
        raise FileNotFoundError(f"model {model.id} ({model.filename}) is missing from storage")
    code_name = "model.py" if model.kind == "file" else "package"
    code_path = _link(model_source, directory.root / "code" / code_name)

    resume_path = None
    if resume_from is not None:
        resume_path = str(
            _link(
                store.path_for(resume_from.storage_key),
                directory.root / "resume" / resume_from.name,
            )
        )

    spec = {
        "job_id": job.id,
        "attempt": attempt,
        "config": job.config,
        "model": {
            "path": str(code_path),
            "kind": model.kind,
            "entry_module": model.entry_module,
            "factory": model.factory,
            "kwargs": job.model_kwargs,
        },
        "dataset": _dataset_spec(store, dataset, directory.root / "data" / "train"),
        "validation_dataset": (
            _dataset_spec(store, validation_dataset, directory.root / "data" / "validation")
            if validation_dataset is not None
            else None
        ),
        "output_dir": str(directory.output_dir),
        "resume_from": resume_path,
        "resume_sha256": resume_from.sha256 if resume_from is not None else None,
    }
    directory.job_file.write_text(json.dumps(spec, indent=2))
    return directory
