"""The stored things and the cluster: ``client.models``, ``client.datasets`` (upload once by
content hash, read, list, delete), ``client.checkpoints`` (find a stored checkpoint by the sha256
of a file, upload weights to start jobs from, delete them, download by id), ``client.workers``
and ``client.environments``. Each method is one REST call of ``docs/api.md``."""

from __future__ import annotations

import builtins
import hashlib
import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel

from ace3.client._download import download_checkpoint_file
from ace3.client._resource import _Resource
from ace3.client.pagination import CursorPage
from ace3.client.types import Checkpoint, Dataset, Environment, Model, Worker
from ace3.config.shards import StreamFormat, TokenDtype
from ace3.config.text_records import RecordKind

StoredT = TypeVar("StoredT", bound=BaseModel)


def _upload(
    resource: _Resource,
    path: str,
    file: str | os.PathLike[str] | BinaryIO,
    filename: str | None,
    data: Mapping[str, Any],
    idempotency_key: str | None,
) -> Any:
    """``POST path`` of ``file`` as a multipart upload with the form fields ``data``: the JSON
    the server answers. Retried (under one idempotency key, a new uuid4 unless given) when the
    connection fails or the server is busy."""
    handle: BinaryIO
    if isinstance(file, str | os.PathLike):
        upload_name, handle, close = filename or Path(file).name, open(file, "rb"), True  # noqa: SIM115
    else:
        upload_name = filename or Path(getattr(file, "name", "upload.bin")).name
        handle, close = file, False
    try:
        response = resource._http.request(
            "POST",
            path,
            files={"file": (upload_name, handle, "application/octet-stream")},
            data=dict(data),
            idempotency_key=idempotency_key or str(uuid.uuid4()),
        )
    finally:
        if close:
            handle.close()
    return response.json()


class _Stored(_Resource, Generic[StoredT]):
    """What ``client.models`` and ``client.datasets`` share: uploaded files by content hash,
    read, listed (by sha256), deleted; each is one REST call under ``_path``."""

    _path: ClassVar[str]
    _item_type: ClassVar[type[Any]]

    def _create(
        self,
        file: str | os.PathLike[str] | BinaryIO,
        filename: str | None,
        data: Mapping[str, Any],
        idempotency_key: str | None,
    ) -> StoredT:
        payload = _upload(self, self._path, file, filename, data, idempotency_key)
        item: StoredT = self._item_type.model_validate(payload)
        return item

    def retrieve(self, item_id: str) -> StoredT:
        item: StoredT = self._item_type.model_validate(
            self._http.request("GET", f"{self._path}/{item_id}").json()
        )
        return item

    def list(
        self, *, sha256: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> CursorPage[StoredT]:
        return self._list(self._path, self._item_type, {"sha256": sha256, "limit": limit}, cursor)

    def delete(self, item_id: str) -> None:
        self._http.request("DELETE", f"{self._path}/{item_id}")


class Models(_Stored[Model]):
    """``/v1/models``: uploaded model code (a ``.py`` file or a package archive) and Hugging
    Face model directories."""

    _path = "/v1/models"
    _item_type = Model

    def create(
        self,
        file: str | os.PathLike[str] | BinaryIO,
        *,
        filename: str | None = None,
        name: str | None = None,
        entry_module: str | None = None,
        factory: str = "build_model",
        idempotency_key: str | None = None,
        kind: Literal["huggingface"] | None = None,
    ) -> Model:
        """Upload model code, or with ``kind="huggingface"`` an archive of a Hugging Face
        model directory (``config.json`` and safetensors weights at its top). The server
        answers with the existing model when this owner already uploaded the same bytes, so
        the upload is retried (under one idempotency key, a new uuid4 unless given) when the
        connection fails or the server is busy."""
        fields = {"name": name, "entry_module": entry_module, "factory": factory, "kind": kind}
        return self._create(file, filename, fields, idempotency_key)


class Datasets(_Stored[Dataset]):
    """``/v1/datasets``: uploaded training and validation data, and datasets registered by
    reference (shards in a bucket the service may read; ``client.datasets.register``, which
    :class:`ace3.Client` binds to itself to return a ``DatasetRef``)."""

    _path = "/v1/datasets"
    _item_type = Dataset

    def create(
        self,
        file: str | os.PathLike[str] | BinaryIO,
        *,
        filename: str | None = None,
        name: str | None = None,
        kind: Literal["file", "directory"] = "file",
        idempotency_key: str | None = None,
        records: RecordKind | None = None,
    ) -> Dataset:
        """Upload a data file, or with ``kind="directory"`` a ``.tar.gz`` of a directory.
        The server answers with the existing dataset when these bytes were uploaded before;
        retried like :meth:`Models.create`. ``records``: the kind of a ``.jsonl`` file's text
        records, as :meth:`ace3.Client.load_dataset` takes it."""
        fields = {"name": name, "kind": kind, "records": records}
        return self._create(file, filename, fields, idempotency_key)

    def _register(
        self,
        uri: str,
        *,
        format: StreamFormat,
        name: str | None = None,
        dtype: TokenDtype | None = None,
        columns: Mapping[Literal["inputs", "targets"], str] | None = None,
        records: RecordKind | None = None,
    ) -> tuple[Dataset, bool]:
        """``POST /v1/datasets/register``: (the dataset, whether it is new). Retried when the
        connection fails or the server is busy: registering the same listing again answers
        with the same dataset."""
        body: dict[str, Any] = {"uri": uri, "format": format, "name": name, "dtype": dtype}
        body["records"] = records
        body["columns"] = dict(columns) if columns is not None else None
        response = self._http.request(
            "POST",
            f"{self._path}/register",
            json_body={key: value for key, value in body.items() if value is not None},
            idempotent=True,
        )
        return Dataset.model_validate(response.json()), response.status_code == 201


_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


class Checkpoints(_Resource):
    """``/v1/checkpoints``: stored checkpoints across your jobs, and weights you uploaded."""

    def upload(
        self,
        file: str | os.PathLike[str],
        *,
        name: str | None = None,
        idempotency_key: str | None = None,
    ) -> Checkpoint:
        """Upload model weights (a ``.safetensors`` file: tensors only, checked by the server)
        to start jobs from: ``TrainingConfig(init_from=checkpoint)``. The same bytes uploaded
        again give the same checkpoint. ``ace3.Trainer`` converts a checkpoint ``.pt`` file to
        safetensors before it uploads it; ``ace3.save_checkpoint(model.state_dict(),
        "weights.safetensors")`` writes one."""
        if Path(file).suffix.lower() != ".safetensors":
            raise ValueError(
                f"{os.fspath(file)!r}: upload weights as a .safetensors file (ace3.Trainer "
                "converts a .pt checkpoint for you; or ace3.save_checkpoint(state_dict, "
                "'weights.safetensors'))"
            )
        payload = _upload(self, "/v1/checkpoints", file, None, {"name": name}, idempotency_key)
        return Checkpoint.model_validate(payload)

    def download(
        self, checkpoint: str | Checkpoint, to: str | os.PathLike[str], *, verify: bool = True
    ) -> Path:
        """Download a stored checkpoint (of any of your jobs) or uploaded weights by id to
        ``to`` (a file path, or an existing directory to put it in under its own name), checked
        against the server's sha256; returns the path."""
        checkpoint_id = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        return download_checkpoint_file(
            self._http,
            f"/v1/checkpoints/{checkpoint_id}/content",
            Path(to),
            checkpoint_id=checkpoint_id,
            name=None,  # (the server's file name)
            expected=checkpoint.sha256 if isinstance(checkpoint, Checkpoint) else None,
            verify=verify,
        )

    def delete(self, checkpoint: str | Checkpoint) -> None:
        """Delete weights you uploaded (:meth:`upload`) by id: their bytes leave the store.
        :class:`~ace3.errors.ConflictError` naming them while a job that has not finished starts
        or distils from them; :class:`~ace3.errors.NotFoundError` for anything else (a
        checkpoint of one of your jobs stays as its ``max_checkpoints`` says)."""
        checkpoint_id = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        self._http.request("DELETE", f"/v1/checkpoints/{checkpoint_id}")

    def find(self, *, sha256: str) -> builtins.list[Checkpoint]:
        """The stored checkpoints (of your jobs) whose file has this sha256, newest first:
        maps a checkpoint file downloaded earlier back to its id (and ``job_id``)."""
        if not isinstance(sha256, str) or not _SHA256.match(sha256):
            raise ValueError(
                f"sha256={sha256!r} is not a sha256: pass 64 hex digits, e.g. "
                "hashlib.sha256(Path(file).read_bytes()).hexdigest()"
            )
        payload = self._http.request(
            "GET", "/v1/checkpoints", params={"sha256": sha256.lower()}
        ).json()
        return [Checkpoint.model_validate(item) for item in payload.get("data") or []]

    def find_file(self, path: str | os.PathLike[str]) -> builtins.list[Checkpoint]:
        """:meth:`find` for a local checkpoint file (hashed here)."""
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        return self.find(sha256=digest.hexdigest())


class Workers(_Resource):
    """``/v1/workers``: the live workers of the cluster and their capacity."""

    def list(self) -> builtins.list[Worker]:
        """The workers that heartbeated recently, oldest first. A job fits a worker when its
        ``num_gpus`` is at most the worker's ``device_count`` and, for ``backend='nccl'``, the
        worker is a CUDA worker; the server refuses (422) a job that fits none of them."""
        payload = self._http.request("GET", "/v1/workers").json()
        return [Worker.model_validate(item) for item in payload.get("data") or []]


class Environments(_Resource):
    """``/v1/environments``: the per-job Python environments your jobs used."""

    def get(self, env_hash: str) -> Environment:
        """The environment with this hash (a job's ``environment.hash``): its requirements, the
        packages it adds to the worker's Python, what it was built for, its size and build time,
        and why its build failed. :class:`~ace3.errors.NotFoundError` when none of your jobs used
        it (environments are shared; another owner's are not shown)."""
        return Environment.model_validate(
            self._http.request("GET", f"/v1/environments/{env_hash}").json()
        )
