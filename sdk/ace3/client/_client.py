"""The ACE3 client: connection settings, the ``models``/``datasets``/``jobs``/
``checkpoints``/``searches``/``workers``/``environments``/``webhooks`` resources, and ``load_model``/``load_dataset``, which upload code
and data only when the server does not already have the same bytes. Also the module-level
default client the trainers use.
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from ace3.client._http import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, HTTPClient
from ace3.client._packing import HF_FACTORY, HUGGINGFACE, is_hf_model, pack_directory, pack_hf_model
from ace3.client.handles import JobHandleLike, SearchHandleLike, job_handle, search_handle
from ace3.client.jobs import Jobs
from ace3.client.resources import (
    Checkpoints,
    Datasets,
    Environments,
    Models,
    Workers,
    _upload,
)
from ace3.client.searches import Searches
from ace3.client.shard_upload import upload_shard_directory
from ace3.client.types import Dataset, Model
from ace3.client.webhooks import Webhooks
from ace3.config.shards import StreamFormat, TokenDtype
from ace3.errors import ACE3Error, PackingError
from ace3.files import sha256_file
from ace3.locations import MODEL_SUPPORTED, SUPPORTED, refuse_url

ENV_API_KEY = "ACE3_API_KEY"
ENV_BASE_URL = "ACE3_BASE_URL"
DEFAULT_BASE_URL = "http://127.0.0.1:8000"

MODEL_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
DATASET_FILE_SUFFIXES = (".pt", ".npz", ".csv", ".jsonl")
DATASET_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


@dataclass(frozen=True)
class ModelRef:
    """An uploaded model, bound to the client that uploaded it (trainers use that client)."""

    model: Model
    client: Client = field(repr=False, compare=False)
    uploaded: bool = False  # False when the server already had these bytes

    @property
    def id(self) -> str:
        return self.model.id

    @property
    def sha256(self) -> str:
        return self.model.sha256

    @property
    def name(self) -> str | None:
        return self.model.name


@dataclass(frozen=True)
class DatasetRef:
    """An uploaded or registered dataset, bound to the client that stored it (``uploaded``:
    whether the server stored it now, False when it had it already)."""

    dataset: Dataset
    client: Client = field(repr=False, compare=False)
    uploaded: bool = False

    @property
    def id(self) -> str:
        return self.dataset.id

    @property
    def sha256(self) -> str:
        return self.dataset.sha256

    @property
    def name(self) -> str | None:
        return self.dataset.name


class ClientDatasets(Datasets):
    """``client.datasets``: :class:`~ace3.client.resources.Datasets`, whose :meth:`register`
    returns a :class:`DatasetRef` bound to the client (usable wherever a dataset is)."""

    def __init__(self, http: HTTPClient, client: Client):
        super().__init__(http)
        self._client = client

    def register(
        self,
        uri: str,
        *,
        format: StreamFormat,
        name: str | None = None,
        dtype: TokenDtype | None = None,
        columns: Mapping[Literal["inputs", "targets"], str] | None = None,
    ) -> DatasetRef:
        """Register the shards under ``uri`` (``s3://bucket/prefix/``, a prefix the service
        may read: its ``ACE3_DATASET_SOURCES``) as a dataset, without sending their bytes: the
        service lists them (each shard's name, size and ETag; parquet row counts) and streams
        them to the jobs that train on it. ``format``: ``"webdataset"`` (.tar), ``"parquet"``,
        ``"jsonl"`` (.jsonl, .jsonl.gz, .jsonl.zst) or ``"tokens"`` (.bin; ``dtype`` "uint16",
        the default, or "uint32"); ``columns``: parquet's inputs and targets columns when not
        named so. Registering the same listing again returns the same dataset
        (``uploaded=False``); a listing that changed is a new one. A uri the service may not
        read, or that holds no shards, is a :class:`~ace3.errors.ValidationError` naming
        ``uri``."""
        dataset, created = self._register(
            uri, format=format, name=name, dtype=dtype, columns=columns
        )
        return DatasetRef(dataset, self._client, uploaded=created)


class Client:
    """A connection to an ACE3 server.

    ``api_key`` and ``base_url`` default to the ``ACE3_API_KEY`` and ``ACE3_BASE_URL``
    environment variables (base URL ``http://127.0.0.1:8000`` when unset). Failed requests
    are retried ``max_retries`` times with backoff; ``timeout`` is in seconds per request.
    ``transport`` replaces the network (an ``httpx.MockTransport`` in tests).

    The most recently constructed client becomes the default one that trainers use when
    given none (see :func:`get_default_client`).
    """

    def __init__(
        self,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ):
        api_key = api_key or os.environ.get(ENV_API_KEY)
        if not api_key:
            raise ACE3Error(
                "No ACE3 API key: set the ACE3_API_KEY environment variable, or pass "
                "api_key=... to ace3.Client()"
            )
        self.api_key = api_key
        self.base_url = (base_url or os.environ.get(ENV_BASE_URL) or DEFAULT_BASE_URL).rstrip("/")
        self.max_retries = max_retries
        self._http = HTTPClient(
            base_url=self.base_url,
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            transport=transport,
        )
        self.models = Models(self._http)
        self.datasets = ClientDatasets(self._http, self)
        self.jobs = Jobs(self._http)
        self.checkpoints = Checkpoints(self._http)
        self.searches = Searches(self._http)
        self.workers = Workers(self._http)
        self.environments = Environments(self._http)
        self.webhooks = Webhooks(self._http)
        set_default_client(self)

    def __repr__(self) -> str:
        return f"Client(base_url={self.base_url!r})"

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self._http.is_closed

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- jobs -----------------------------------------------------------------------------

    def job(self, job_id: str) -> JobHandleLike:
        """A handle on an existing job (to wait on, cancel, read metrics and checkpoints): an
        :class:`ace3.JobHandle` (see :mod:`ace3.client.handles`)."""
        return job_handle(self.jobs.retrieve(job_id), self)

    def search(self, search_id: str) -> SearchHandleLike:
        """A handle on an existing hyperparameter search (to wait on, cancel, read trials): an
        :class:`ace3.SearchHandle`."""
        return search_handle(self.searches.retrieve(search_id), self)

    # -- uploads --------------------------------------------------------------------------

    def load_model(
        self,
        path: str | os.PathLike[str],
        factory: str = "build_model",
        entry_module: str | None = None,
        name: str | None = None,
    ) -> ModelRef:
        """Upload model code unless the server already has it, and return a reference.

        ``path`` is a ``.py`` file defining ``factory`` (a function returning an
        ``nn.Module``, or a class), or a package: a directory (packed here) or a
        ``.tar.gz``/``.tar``/``.zip`` archive, with ``entry_module`` the dotted module defining the
        factory (e.g. ``"mypkg.model"``). A directory holding an ``__init__.py`` is packed
        under its own name, so ``load_model("src/mypkg", entry_module="mypkg.model")`` works.

        Without ``entry_module``, a directory with a ``config.json`` at its top (what
        ``save_pretrained`` writes), or an archive of one, is a Hugging Face model: packed and
        uploaded with ``kind="huggingface"`` (links to files, as in the hub's cache, packed as
        those files; pickled weights next to safetensors ones left out, with a warning), and
        built in the job with ``from_pretrained``.
        """
        source = _existing_path(path, "model")
        if not entry_module and is_hf_model(source):
            if factory not in ("build_model", HF_FACTORY):
                raise ValueError(
                    f"{source} is a Hugging Face model directory, built with {HF_FACTORY}: "
                    "leave factory out"
                )
            if not source.is_dir():
                return self._upload_model(source, HF_FACTORY, None, name, kind=HUGGINGFACE)
            with tempfile.TemporaryDirectory(prefix="ace3-pack-") as scratch:
                archive = Path(scratch) / f"{source.resolve().name}.tar.gz"
                pack_hf_model(source, archive)
                return self._upload_model(archive, HF_FACTORY, None, name, kind=HUGGINGFACE)
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
                return self._upload_model(archive, factory, entry_module, name)
        lowered = source.name.lower()
        if lowered.endswith(".py"):
            if entry_module:
                raise ValueError(
                    f"entry_module applies to packages (a directory or an archive), not to "
                    f"the single file {source}; leave it out"
                )
            return self._upload_model(source, factory, None, name)
        if lowered.endswith(MODEL_ARCHIVE_SUFFIXES):
            if not entry_module:
                raise ValueError(
                    f"{source} is an archive: pass entry_module=, the dotted module that "
                    f"defines {factory!r} (e.g. entry_module='mypkg.model')"
                )
            return self._upload_model(source, factory, entry_module, name)
        raise ValueError(
            f"cannot load a model from {source}: expected a .py file, a package directory, "
            "or a .tar.gz/.tar/.zip archive of one"
        )

    def load_dataset(
        self,
        path: str | os.PathLike[str],
        name: str | None = None,
        *,
        format: StreamFormat | None = None,
        dtype: TokenDtype | None = None,
        columns: Mapping[Literal["inputs", "targets"], str] | None = None,
    ) -> DatasetRef:
        """Upload a dataset unless the server already has it, and return a reference.

        ``path`` is a data file (``.pt``, ``.npz``, ``.csv``, ``.jsonl``), a directory
        (packed here; it holds one data file, or a ``dataset.py`` defining
        ``build_dataset(split)``), or a ``.tar.gz``/``.tar``/``.zip`` of such a directory.

        With ``format=`` (``"webdataset"``, ``"parquet"``, ``"jsonl"`` or ``"tokens"``, as
        :meth:`ClientDatasets.register` takes, with its ``dtype`` and ``columns``), ``path``
        is a directory of shards (its files with the format's endings, at any depth; or one
        shard file): each is uploaded unless the service has it already (by sha256, so an
        interrupted upload resumes), each under the server's upload cap, and the dataset
        streams them to the jobs shard by shard (kind ``"shards"``) instead of copying it
        whole. ``uploaded`` is whether the dataset is new.
        """
        if format is None and (dtype is not None or columns is not None):
            raise ValueError("dtype= and columns= go with format=, for a directory of shards")
        source = _existing_path(path, "dataset")
        if format is not None:
            dataset, created, _ = upload_shard_directory(
                self._http,
                functools.partial(_upload, self.datasets),
                source,
                format=format,
                name=name,
                dtype=dtype,
                columns=columns,
            )
            return DatasetRef(dataset, self, uploaded=created)
        if source.is_dir():
            with tempfile.TemporaryDirectory(prefix="ace3-pack-") as scratch:
                archive = Path(scratch) / f"{source.resolve().name}.tar.gz"
                pack_directory(source, archive)
                return self._upload_dataset(archive, "directory", name)
        lowered = source.name.lower()
        if lowered.endswith(DATASET_ARCHIVE_SUFFIXES):
            return self._upload_dataset(source, "directory", name)
        if lowered.endswith(DATASET_FILE_SUFFIXES):
            return self._upload_dataset(source, "file", name)
        raise ValueError(
            f"cannot load a dataset from {source}: expected a {', '.join(DATASET_FILE_SUFFIXES)} "
            "file, a directory, or a .tar.gz/.tar/.zip of a directory"
        )

    def _upload_model(
        self,
        file: Path,
        factory: str,
        entry_module: str | None,
        name: str | None,
        kind: Literal["huggingface"] | None = None,
    ) -> ModelRef:
        digest = sha256_file(file)
        for model in self.models.list(sha256=digest).data:
            if model.factory == factory and (model.entry_module or None) == entry_module:
                return ModelRef(model, self, uploaded=False)
        model = self.models.create(
            file, name=name, entry_module=entry_module, factory=factory, kind=kind
        )
        if model.factory != factory or (model.entry_module or None) != entry_module:
            warnings.warn(
                f"the server already had these bytes as model {model.id} with "
                f"factory={model.factory!r}, entry_module={model.entry_module!r}, and returned "
                f"it instead of one with factory={factory!r}, entry_module={entry_module!r}",
                stacklevel=3,
            )
        return ModelRef(model, self, uploaded=True)

    def _upload_dataset(
        self, file: Path, kind: Literal["file", "directory"], name: str | None
    ) -> DatasetRef:
        digest = sha256_file(file)
        for dataset in self.datasets.list(sha256=digest).data:
            if dataset.kind == kind:
                return DatasetRef(dataset, self, uploaded=False)
        dataset = self.datasets.create(file, name=name, kind=kind)
        return DatasetRef(dataset, self, uploaded=True)


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


# -- the default client ---------------------------------------------------------------------

_default_client: Client | None = None
_default_lock = threading.Lock()


def set_default_client(client: Client | None) -> None:
    """Make ``client`` the one trainers use when given none (None forgets it)."""
    global _default_client
    with _default_lock:
        _default_client = client


def get_default_client() -> Client:
    """The most recently constructed (or set) open client, else a new one built from
    ``ACE3_API_KEY`` / ``ACE3_BASE_URL``."""
    with _default_lock:
        client = _default_client
    if client is not None and not client.is_closed:
        return client
    return Client()
