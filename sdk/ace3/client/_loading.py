"""``client.load_model`` and ``client.load_dataset``: what a path is (a file, a package or data
directory packed here, an archive, a directory of shards), and the upload that happens only
when the server does not already have the same bytes (found by sha256). Each answers (the
stored model or dataset, whether it was stored now); the client binds it into a reference."""

from __future__ import annotations

import functools
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from ace3.client._http import HTTPClient
from ace3.client._packing import HF_FACTORY, HUGGINGFACE, is_hf_model, pack_directory, pack_hf_model
from ace3.client.resources import Datasets, Models, _upload
from ace3.client.shard_upload import upload_shard_directory
from ace3.client.types import Dataset, Model
from ace3.config.shards import StreamFormat, TokenDtype
from ace3.config.text_records import RecordKind
from ace3.errors import PackingError
from ace3.files import sha256_file
from ace3.locations import MODEL_SUPPORTED, SUPPORTED, refuse_url

MODEL_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
DATASET_FILE_SUFFIXES = (".pt", ".npz", ".csv", ".jsonl")
DATASET_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


def load_model(
    models: Models,
    path: str | os.PathLike[str],
    factory: str,
    entry_module: str | None,
    name: str | None,
) -> tuple[Model, bool]:
    """:meth:`ace3.Client.load_model` (documented there)."""
    source = _existing_path(path, "model")
    if not entry_module and is_hf_model(source):
        if factory not in ("build_model", HF_FACTORY):
            raise ValueError(
                f"{source} is a Hugging Face model directory, built with {HF_FACTORY}: "
                "leave factory out"
            )
        if not source.is_dir():
            return _upload_model(models, source, HF_FACTORY, None, name, kind=HUGGINGFACE)
        with tempfile.TemporaryDirectory(prefix="ace3-pack-") as scratch:
            archive = Path(scratch) / f"{source.resolve().name}.tar.gz"
            pack_hf_model(source, archive)
            return _upload_model(models, archive, HF_FACTORY, None, name, kind=HUGGINGFACE)
    if source.is_dir():
        if not entry_module:
            raise ValueError(
                f"{source} is a directory: pass entry_module=, the dotted module that "
                f"defines {factory!r} (e.g. entry_module='mypkg.model')"
            )
        prefix = source.resolve().name if (source / "__init__.py").is_file() else None
        with tempfile.TemporaryDirectory(prefix="ace3-pack-") as scratch:
            archive = Path(scratch) / f"{source.resolve().name}.tar.gz"
            members = pack_directory(source, archive, prefix=prefix)
            _check_entry_module(source, entry_module, members)
            return _upload_model(models, archive, factory, entry_module, name)
    lowered = source.name.lower()
    if lowered.endswith(".py"):
        if entry_module:
            raise ValueError(
                f"entry_module applies to packages (a directory or an archive), not to "
                f"the single file {source}; leave it out"
            )
        return _upload_model(models, source, factory, None, name)
    if lowered.endswith(MODEL_ARCHIVE_SUFFIXES):
        if not entry_module:
            raise ValueError(
                f"{source} is an archive: pass entry_module=, the dotted module that "
                f"defines {factory!r} (e.g. entry_module='mypkg.model')"
            )
        return _upload_model(models, source, factory, entry_module, name)
    raise ValueError(
        f"cannot load a model from {source}: expected a .py file, a package directory, "
        "or a .tar.gz/.tar/.zip archive of one"
    )


def load_dataset(
    datasets: Datasets,
    http: HTTPClient,
    path: str | os.PathLike[str],
    name: str | None,
    *,
    format: StreamFormat | None,
    dtype: TokenDtype | None,
    columns: Mapping[Literal["inputs", "targets"], str] | None,
    records: RecordKind | None = None,
) -> tuple[Dataset, bool]:
    """:meth:`ace3.Client.load_dataset` (documented there)."""
    if format is None and (dtype is not None or columns is not None):
        raise ValueError("dtype= and columns= go with format=, for a directory of shards")
    source = _existing_path(path, "dataset")
    if format is not None:
        dataset, created, _ = upload_shard_directory(
            http,
            functools.partial(_upload, datasets),
            source,
            format=format,
            name=name,
            dtype=dtype,
            columns=columns,
            records=records,
        )
        return dataset, created
    if source.is_dir():
        with tempfile.TemporaryDirectory(prefix="ace3-pack-") as scratch:
            archive = Path(scratch) / f"{source.resolve().name}.tar.gz"
            pack_directory(source, archive)
            return _upload_dataset(datasets, archive, "directory", name, records)
    lowered = source.name.lower()
    if lowered.endswith(DATASET_ARCHIVE_SUFFIXES):
        return _upload_dataset(datasets, source, "directory", name, records)
    if lowered.endswith(DATASET_FILE_SUFFIXES):
        return _upload_dataset(datasets, source, "file", name, records)
    raise ValueError(
        f"cannot load a dataset from {source}: expected a {', '.join(DATASET_FILE_SUFFIXES)} "
        "file, a directory, or a .tar.gz/.tar/.zip of a directory"
    )


def _upload_model(
    models: Models,
    file: Path,
    factory: str,
    entry_module: str | None,
    name: str | None,
    kind: Literal["huggingface"] | None = None,
) -> tuple[Model, bool]:
    digest = sha256_file(file)
    for model in models.list(sha256=digest).data:
        if model.factory == factory and (model.entry_module or None) == entry_module:
            return model, False
    model = models.create(file, name=name, entry_module=entry_module, factory=factory, kind=kind)
    if model.factory != factory or (model.entry_module or None) != entry_module:
        warnings.warn(
            f"the server already had these bytes as model {model.id} with "
            f"factory={model.factory!r}, entry_module={model.entry_module!r}, and returned "
            f"it instead of one with factory={factory!r}, entry_module={entry_module!r}",
            stacklevel=4,
        )
    return model, True


def _upload_dataset(
    datasets: Datasets,
    file: Path,
    kind: Literal["file", "directory"],
    name: str | None,
    records: RecordKind | None,
) -> tuple[Dataset, bool]:
    """(the dataset, uploaded now): the server's of these bytes when it has them (and, with
    ``records``, the same kind of records: else it is sent again, to be checked and named)."""
    digest = sha256_file(file)
    for dataset in datasets.list(sha256=digest).data:
        if dataset.kind == kind and records in (None, dataset.records):
            return dataset, False
    dataset = datasets.create(file, name=name, kind=kind, records=records)
    return dataset, True


def _existing_path(path: str | os.PathLike[str], what: str) -> Path:
    refuse_url(path, what, SUPPORTED if what == "dataset" else MODEL_SUPPORTED)
    source = Path(path).expanduser()
    if not source.exists():
        raise FileNotFoundError(f"{what} path not found: {source}")
    return source


def _check_entry_module(source: Path, entry_module: str, members: list[str]) -> None:
    module_path = entry_module.replace(".", "/")
    names = set(members)
    if f"{module_path}.py" in names or f"{module_path}/__init__.py" in names:
        return
    raise PackingError(
        f"entry_module {entry_module!r} is not in {source}: looked for {module_path}.py or "
        f"{module_path}/__init__.py in the packed files (a directory with an __init__.py is "
        f"packed under its own name, {source.resolve().name}/)"
    )
