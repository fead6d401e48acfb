"""Materialises a job attempt into its own directory: code, data, the job file, an output dir.

The runtime reads only ``job.json``; every path in it is the path the job sees (``/job/...``
inside the bubblewrap sandbox, the real path otherwise). Model code, data, the resume
checkpoint and the weights a fine-tuning job starts from are **copies** of the stored bytes, verified against their sha256 while they are
copied, read-only and owned by the worker: nothing a job does can change what the store holds.
The job writes only ``output/`` (events, checkpoints, artifacts), ``home/`` and ``tmp/``, which
belong to its uid. The layout is documented in docs/runtime.md::

    <work_dir>/<job id>/attempt-<n>[-node-<k>]/   root, mode 0750, group: the job's gid
        job.json  code/  data/  resume/  init/  teacher/   read-only copies
        env/                                        the job's environment: hard links of the
                                                    worker's cached tree (ace3_worker.environments)
        data/<split>/shards/                        a streamed dataset's shards, linked in
                                                    while the job runs (shard_streams)
        etc/passwd  etc/group                       the job's /etc/passwd and /etc/group
        output/  home/  tmp/                        the job's own (mode 0700)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ace3.config.text_records import named_records
from ace3_control.models import Job, JobCheckpoint, StoredDataset, StoredModel, fetch_sha256
from ace3_control.storage import ArtifactStore, StoredDigestError
from ace3_control.stored_weights import StoredWeights
from ace3_worker.environments.cache import Pin, link_tree
from ace3_worker.sandbox.bubblewrap import ISOLATED_HOSTS
from ace3_worker.shard_streams import (
    Readers,
    ShardStream,
    Split,
    check_fits,
    manifest_of,
    open_shard_dirs,
    plan_readers,
    requests_dir,
    stream_dataset,
)
from ace3_worker.teacher_inputs import TeacherRows, copy_teacher

_READ_ONLY_FILE = 0o444
_READ_ONLY_DIR = 0o555
_PRIVATE_DIR = 0o700


class InputCorruptedError(RuntimeError):
    """A stored input's bytes no longer match the sha256 recorded when it was uploaded."""


@dataclass(frozen=True)
class JobOwner:
    """Who the job's processes run as: its writable directories belong to them."""

    uid: int
    gid: int
    user_name: str


@dataclass
class JobDirectory:
    root: Path  # the real path, on the worker
    visible_root: PurePosixPath  # where the job sees ``root``
    # The datasets streamed into it while the job runs (ace3_worker.shard_feed fills them).
    streams: tuple[ShardStream, ...] = field(default=())
    # Their readers: the request files the feeder reads, the attempt's share of the cache.
    readers: Readers | None = None
    # The cached environment linked in as env/, pinned until the attempt is over.
    environment_pin: Pin | None = None

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
    def checkpoints_dir(self) -> Path:
        return self.output_dir / "checkpoints"

    @property
    def artifacts_dir(self) -> Path:
        """Files the job writes here are synced to the artifact store while it runs
        (``artifact://`` paths in the job config name this directory)."""
        return self.output_dir / "artifacts"

    @property
    def home_dir(self) -> Path:
        return self.root / "home"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    @property
    def etc_dir(self) -> Path:
        return self.root / "etc"

    def visible(self, path: Path) -> PurePosixPath:
        """Where the job sees ``path`` (a path inside this directory)."""
        return self.visible_root / path.relative_to(self.root).as_posix()


def _copy_stored(store: ArtifactStore, key: str, target: Path, sha256: str | None) -> Path:
    """A stored file (verified while it is copied) or an extracted directory tree (verified
    against its recorded tree digest; None: a tree stored before digests were recorded),
    fetched from the store into the job's directory; a mismatch is refused."""
    try:
        return store.fetch(key, target, sha256)
    except StoredDigestError as exc:
        raise InputCorruptedError(
            f"{exc}: the artifact store is corrupted; upload the file again"
        ) from exc


def _freeze(path: Path) -> None:
    """Make a copied input read-only (files 0444, directories 0555), links untouched."""
    for directory, subdirectories, names in os.walk(path, topdown=False):
        for name in names:
            entry = Path(directory) / name
            if not entry.is_symlink():
                entry.chmod(_READ_ONLY_FILE)
        for name in subdirectories:
            entry = Path(directory) / name
            if not entry.is_symlink():
                entry.chmod(_READ_ONLY_DIR)
    if path.is_dir():
        path.chmod(_READ_ONLY_DIR)
    elif not path.is_symlink():
        path.chmod(_READ_ONLY_FILE)


def _private_dir(path: Path, owner: JobOwner | None) -> Path:
    path.mkdir(mode=_PRIVATE_DIR, parents=True, exist_ok=True)
    if owner is not None:
        os.chown(path, owner.uid, owner.gid)
    path.chmod(_PRIVATE_DIR)
    return path


def traversable_dir(path: Path) -> None:
    """A directory job uids may pass through but not list (its entries have random names)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0 and stat.S_IMODE(path.stat().st_mode) != 0o711:
        path.chmod(0o711)


def _dataset_spec(
    store: ArtifactStore,
    directory: JobDirectory,
    dataset: StoredDataset,
    split: Split,
    owner: JobOwner | None,
    cache_bytes: int | None,
) -> dict[str, Any]:
    into = directory.root / "data" / split
    manifest = manifest_of(dataset)
    if manifest is not None:
        if cache_bytes is not None:
            check_fits(manifest, cache_bytes)
        requests = _private_dir(requests_dir(directory.output_dir), owner)
        spec, stream = stream_dataset(
            split, manifest, into, requests, directory.visible, kind=dataset.kind
        )
        directory.streams = (*directory.streams, stream)
        records = named_records(getattr(dataset, "batch_layout", None))  # (records= named)
        return {**spec, "records": records} if records is not None else spec
    if not store.exists(dataset.storage_key):
        raise FileNotFoundError(
            f"dataset {dataset.id} ({dataset.filename}) is missing from storage"
        )
    suffix = PurePosixPath(dataset.storage_key).suffix
    name = "tree" if dataset.kind == "directory" else f"data{suffix}"
    copy = _copy_stored(store, dataset.storage_key, into / name, fetch_sha256(dataset))
    entry: dict[str, Any] = {"path": str(directory.visible(copy))}
    records = named_records(getattr(dataset, "batch_layout", None))  # (records= at upload)
    if records is not None:
        entry["records"] = records
    return entry


def _identity_files(directory: JobDirectory, owner: JobOwner | None) -> None:
    """The job's /etc/passwd and /etc/group (root, and the job's own user), and the /etc/hosts
    of a job on a network of its own."""
    uid, gid, name = (owner.uid, owner.gid, owner.user_name) if owner else (65534, 65534, "job")
    home = directory.visible(directory.home_dir)
    directory.etc_dir.mkdir()
    (directory.etc_dir / "passwd").write_text(
        f"root:x:0:0:root:/root:/usr/sbin/nologin\n{name}:x:{uid}:{gid}::{home}:/usr/sbin/nologin\n"
    )
    (directory.etc_dir / "group").write_text(f"root:x:0:\n{name}:x:{gid}:\n")
    (directory.etc_dir / "hosts").write_text(ISOLATED_HOSTS)


def set_token_labels(spec: dict[str, Any], model_kind: str) -> None:
    """A Hugging Face causal LM (a stored model directory) shifts its labels itself: its
    ``tokens`` streams give the input ids as labels (``StreamSpec.labels``), not the next
    tokens, which it would shift once more."""
    if model_kind != "huggingface":
        return
    for entry in (spec["dataset"], spec["validation_dataset"]):
        stream = (entry or {}).get("stream")
        if stream is not None and stream.get("format") == "tokens":
            stream["labels"] = "inputs"


def needs_initial_weights(job: Job, resume_from: JobCheckpoint | None) -> bool:
    """Whether an attempt gets the weights the job starts from: not when it resumes (a resume
    holds weights of its own), except a LoRA job's, whose checkpoints hold only the adapters."""
    return resume_from is None or bool((job.config or {}).get("lora"))


def make_skeleton(
    root: Path, owner: JobOwner | None, visible_root: PurePosixPath | None, *, made: bool = False
) -> JobDirectory:
    """An attempt directory without its inputs: ``root`` (mode 0750, group: the job's gid),
    ``etc/`` and the job's own ``output/``, ``home/`` and ``tmp/``: what a sandbox is started
    on. A warm sandbox's is made before its job is known (:mod:`ace3_worker.warm`), in a
    ``root`` its caller ``made`` (empty, and held: :func:`ace3_worker.held_dirs.make_held_dir`)."""
    directory = JobDirectory(root, visible_root or PurePosixPath(root))
    if not made:
        root.mkdir(mode=0o750)
    if owner is not None:
        os.chown(root, os.geteuid(), owner.gid)
    root.chmod(0o750)
    _identity_files(directory, owner)
    _freeze(directory.etc_dir)
    for path in (directory.output_dir, directory.artifacts_dir, directory.checkpoints_dir):
        _private_dir(path, owner)
    _private_dir(directory.home_dir, owner)
    _private_dir(directory.tmp_dir, owner)
    return directory


def prepare_job_directory(
    work_dir: Path,
    store: ArtifactStore,
    job: Job,
    attempt: int,
    model: StoredModel,
    dataset: StoredDataset,
    validation_dataset: StoredDataset | None,
    resume_from: JobCheckpoint | None,
    node_rank: int | None = None,
    *,
    visible_root: PurePosixPath | None = None,
    owner: JobOwner | None = None,
    init_from: StoredWeights | None = None,
    teacher: TeacherRows | None = None,
    skeleton: Path | None = None,
    dataset_cache_bytes: int | None = None,
    worker_slots: int = 1,
    environment: Path | None = None,
) -> JobDirectory:
    """``<work_dir>/<job>/attempt-<n>``; one node of a multi-node job gets ``attempt-<n>-node-<k>``
    (workers on one machine may share a work directory). ``visible_root``: where the job sees
    the directory (default: its real path); ``owner``: the uid the job runs as (None: this
    process's own); ``init_from``: the weights the job starts from (not copied when the attempt
    resumes: a resume holds weights of its own, except a LoRA job's, which holds its adapters
    alone); ``teacher``: a distillation job's teacher, copied into ``teacher/``; ``skeleton``:
    a warm sandbox's directory (:func:`make_skeleton`, for the same owner), moved into place
    (its sandbox keeps seeing it: a bind mount follows the directory, not its name) instead of
    a new one. A streamed dataset's shards are not copied: its directory starts empty
    (:mod:`ace3_worker.shard_streams`), none of its shards larger than
    ``dataset_cache_bytes``, its readers' current shards within ``dataset_cache_bytes /
    worker_slots`` (:func:`~ace3_worker.shard_streams.plan_readers`). ``environment``: the
    job's environment in the worker's cache, linked in as ``env/`` (job.json's
    ``environment``: the runtime adds it to ``sys.path`` after the worker's packages)."""
    traversable_dir(work_dir)
    traversable_dir(work_dir / job.id)
    root = attempt_path(work_dir, job.id, attempt, node_rank)
    if root.exists():
        shutil.rmtree(root)
    if skeleton is None:
        directory = make_skeleton(root, owner, visible_root)
    else:
        skeleton.rename(root)
        directory = JobDirectory(root, visible_root or PurePosixPath(root))

    if not store.exists(model.storage_key):
        raise FileNotFoundError(f"model {model.id} ({model.filename}) is missing from storage")
    code_name = "model.py" if model.kind == "file" else "package"
    code_path = _copy_stored(
        store, model.storage_key, root / "code" / code_name, fetch_sha256(model)
    )

    resume_path = None
    if resume_from is not None:
        resume_path = _copy_stored(
            store, resume_from.storage_key, root / "resume" / resume_from.name, resume_from.sha256
        )
    init_path = None
    if init_from is not None and needs_initial_weights(job, resume_from):
        init_path = _copy_stored(
            store, init_from.storage_key, root / "init" / init_from.name, init_from.sha256
        )
    spec = {
        "job_id": job.id,
        "attempt": attempt,
        "config": job.config,
        "model": {
            "path": str(directory.visible(code_path)),
            "kind": model.kind,
            "entry_module": model.entry_module,
            "factory": model.factory,
            "kwargs": job.model_kwargs,
        },
        "dataset": _dataset_spec(store, directory, dataset, "train", owner, dataset_cache_bytes),
        "validation_dataset": (
            _dataset_spec(
                store, directory, validation_dataset, "validation", owner, dataset_cache_bytes
            )
            if validation_dataset is not None
            else None
        ),
        "output_dir": str(directory.visible(directory.output_dir)),
        "resume_from": str(directory.visible(resume_path)) if resume_path is not None else None,
        "resume_sha256": resume_from.sha256 if resume_from is not None else None,
        "init_from": str(directory.visible(init_path)) if init_path is not None else None,
        "init_from_sha256": init_from.sha256 if init_path is not None and init_from else None,
        # Halved once for every earlier attempt that ran out of memory inside a step.
        "micro_batch_split": 2 ** (job.micro_batch_halvings or 0),
    }
    set_token_labels(spec, model.kind)
    if environment is not None:
        link_tree(environment, root / "env")
        spec["environment"] = str(directory.visible(root / "env"))
    if directory.streams and dataset_cache_bytes is not None:
        directory.readers = plan_readers(
            job.config,
            int(job.num_processes),
            node_rank,
            directory.streams,
            validation_given=validation_dataset is not None,
            cache_bytes=dataset_cache_bytes,
            slots=worker_slots,
        )
    if teacher is not None:
        spec["teacher"] = copy_teacher(
            teacher, root / "teacher", lambda *a: _copy_stored(store, *a), directory.visible
        )
    directory.job_file.write_text(json.dumps(spec, indent=2))
    for path in (
        directory.job_file,
        *(root / name for name in ("code", "data", "resume", "init", "teacher")),
    ):
        if path.exists():
            _freeze(path)
    open_shard_dirs(directory.streams)
    return directory


def attempt_path(work_dir: Path, job_id: str, attempt: int, node_rank: int | None = None) -> Path:
    """Where an attempt's directory is (or will be)."""
    name = f"attempt-{attempt}" if node_rank is None else f"attempt-{attempt}-node-{node_rank}"
    return work_dir / job_id / name


def unfreeze_and_retry(function: Any, path: str, _error: Any) -> None:
    """rmtree's error handler: a worker that is not root cannot remove what its read-only
    (0555) input directories hold (``code/``, ``data/``, the environment's ``env/``, whose
    files are hard links to its cache: left behind, they would keep evicted environments on
    disk), so the directory is made writable and the removal tried again."""
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), _PRIVATE_DIR)  # (rmtree never descends into a link)
        function(path)


def remove_attempt_directory(root: Path) -> None:
    """Remove an attempt's directory (whatever the job left in it: rmtree never follows a
    link), and the job's directory once no attempt of it is left on this worker."""
    shutil.rmtree(root, onerror=unfreeze_and_retry)
    with contextlib.suppress(OSError):
        root.parent.rmdir()  # (only when empty: another node or attempt may still be there)


def hand_over(path: Path, owner: JobOwner | None) -> None:
    """Give the job's uid what the worker wrote into one of its directories (restored
    artifacts), without following links."""
    if owner is None:
        return
    for directory, subdirectories, names in os.walk(path):
        for name in [*subdirectories, *names]:
            os.chown(Path(directory) / name, owner.uid, owner.gid, follow_symlinks=False)
    os.chown(path, owner.uid, owner.gid, follow_symlinks=False)
