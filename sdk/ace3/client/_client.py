"""The ACE3 client: connection settings, the ``models``/``datasets``/``jobs``/
``checkpoints``/``searches``/``workers``/``environments``/``webhooks`` resources, and ``load_model``/``load_dataset``, which upload code
and data only when the server does not already have the same bytes (``_loading``), as
the references :class:`ModelRef` / :class:`DatasetRef`. Also the module-level default client the trainers use.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from ace3.client import _loading
from ace3.client._http import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT, HTTPClient
from ace3.client.handles import JobHandleLike, SearchHandleLike, job_handle, search_handle
from ace3.client.jobs import Jobs
from ace3.client.resources import Checkpoints, Datasets, Environments, Models, Workers
from ace3.client.searches import Searches
from ace3.client.types import Dataset, Model
from ace3.client.webhooks import Webhooks
from ace3.config.shards import StreamFormat, TokenDtype
from ace3.config.text_records import RecordKind
from ace3.errors import ACE3Error

ENV_API_KEY = "ACE3_API_KEY"
ENV_BASE_URL = "ACE3_BASE_URL"
DEFAULT_BASE_URL = "http://127.0.0.1:8000"


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

    @property
    def records(self) -> str | None:
        """The kind of its text records (chat, prompt_completion, text), None if none known."""
        return self.dataset.records


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
        records: RecordKind | None = None,
    ) -> DatasetRef:
        """Register the shards under ``uri`` (``s3://bucket/prefix/``, a prefix the service
        may read: its ``ACE3_DATASET_SOURCES``) as a dataset, without sending their bytes: the
        service lists them (each shard's name, size and ETag; parquet row counts) and streams
        them to the jobs that train on it. ``format``: ``"webdataset"`` (.tar), ``"parquet"``,
        ``"jsonl"`` (.jsonl, .jsonl.gz, .jsonl.zst) or ``"tokens"`` (.bin; ``dtype`` "uint16",
        the default, or "uint32"); ``columns``: parquet's inputs and targets columns when not
        named so; ``records``: jsonl's kind of text records (``"chat"``,
        ``"prompt_completion"``, ``"text"``; a Hugging Face model's job streams them, each rank
        tokenizing its own shards). Registering the
        same listing again returns the same dataset
        (``uploaded=False``); a listing that changed is a new one. A uri the service may not
        read, or that holds no shards, is a :class:`~ace3.errors.ValidationError` naming
        ``uri``."""
        dataset, created = self._register(
            uri, format=format, name=name, dtype=dtype, columns=columns, records=records
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
        model, uploaded = _loading.load_model(self.models, path, factory, entry_module, name)
        return ModelRef(model, self, uploaded=uploaded)

    def load_dataset(
        self,
        path: str | os.PathLike[str],
        name: str | None = None,
        *,
        format: StreamFormat | None = None,
        dtype: TokenDtype | None = None,
        columns: Mapping[Literal["inputs", "targets"], str] | None = None,
        records: RecordKind | None = None,
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

        ``records`` names the kind of a ``.jsonl`` file's text records, for a Hugging Face
        model: ``"chat"`` (OpenAI's ``{"messages": [...]}``), ``"prompt_completion"`` or
        ``"text"``; each record need only hold that kind's fields. Left out, the first record
        tells. The server checks the first records (a :class:`~ace3.errors.ValidationError`
        naming ``records`` and the line), and refuses ``records`` for another format.
        """
        dataset, uploaded = _loading.load_dataset(
            self.datasets,
            self._http,
            path,
            name,
            format=format,
            dtype=dtype,
            columns=columns,
            records=records,
        )
        return DatasetRef(dataset, self, uploaded=uploaded)


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
