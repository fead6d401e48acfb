"""The stored things and the cluster: ``client.models``, ``client.datasets`` (upload once by
content hash, read, list, delete), ``client.checkpoints`` (find a stored checkpoint by the sha256
of a file, upload weights to start jobs from, download by id) and ``client.workers``. Each method is one REST call of ``docs/api.md``."""

from __future__ import annotations

import builtins
import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Literal

from ace3.client.pagination import CursorPage

if TYPE_CHECKING:
    pass

from ace3.client._resource import _Resource
from ace3.client.types import Checkpoint, Dataset, Model, Worker


def _upload_file(path: str | os.PathLike[str] | BinaryIO, filename: str | None):
    """(filename, file object, close it?) for a multipart upload."""
    if isinstance(path, str | os.PathLike):
        handle = open(path, "rb")  # noqa: SIM115 - closed by the caller
        return filename or Path(path).name, handle, True
    name = filename or Path(getattr(path, "name", "upload.bin")).name
    return name, path, False


class Models(_Resource):
    """``/v1/models``: uploaded model code (a ``.py`` file or a package archive)."""

    def create(
        self,
        file: str | os.PathLike[str] | BinaryIO,
        *,
        filename: str | None = None,
        name: str | None = None,
        entry_module: str | None = None,
        factory: str = "build_model",
        idempotency_key: str | None = None,
    ) -> Model:
        """Upload model code. The server answers with the existing model when this owner
        already uploaded the same bytes, so the upload is retried (under one idempotency key,
        a new uuid4 unless given) when the connection fails or the server is busy."""
        upload_name, handle, close = _upload_file(file, filename)
        try:
            response = self._http.request(
                "POST",
                "/v1/models",
                files={"file": (upload_name, handle, "application/octet-stream")},
                data={"name": name, "entry_module": entry_module, "factory": factory},
                idempotency_key=idempotency_key or str(uuid.uuid4()),
            )
        finally:
            if close:
                handle.close()
        return Model.model_validate(response.json())

    def retrieve(self, model_id: str) -> Model:
        return Model.model_validate(self._http.request("GET", f"/v1/models/{model_id}").json())

    def list(
        self, *, sha256: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> CursorPage[Model]:
        return self._list("/v1/models", Model, {"sha256": sha256, "limit": limit}, cursor)

    def delete(self, model_id: str) -> None:
        self._http.request("DELETE", f"/v1/models/{model_id}")


class Datasets(_Resource):
    """``/v1/datasets``: uploaded training and validation data."""

    def create(
        self,
        file: str | os.PathLike[str] | BinaryIO,
        *,
        filename: str | None = None,
        name: str | None = None,
        kind: Literal["file", "directory"] = "file",
        idempotency_key: str | None = None,
    ) -> Dataset:
        """Upload a data file, or with ``kind="directory"`` a ``.tar.gz`` of a directory.
        The server answers with the existing dataset when these bytes were uploaded before;
        retried like :meth:`Models.create`."""
        upload_name, handle, close = _upload_file(file, filename)
        try:
            response = self._http.request(
                "POST",
                "/v1/datasets",
                files={"file": (upload_name, handle, "application/octet-stream")},
                data={"name": name, "kind": kind},
                idempotency_key=idempotency_key or str(uuid.uuid4()),
            )
        finally:
            if close:
                handle.close()
        return Dataset.model_validate(response.json())

    def retrieve(self, dataset_id: str) -> Dataset:
        response = self._http.request("GET", f"/v1/datasets/{dataset_id}")
        return Dataset.model_validate(response.json())

    def list(
        self, *, sha256: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> CursorPage[Dataset]:
        return self._list("/v1/datasets", Dataset, {"sha256": sha256, "limit": limit}, cursor)

    def delete(self, dataset_id: str) -> None:
        self._http.request("DELETE", f"/v1/datasets/{dataset_id}")


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
        upload_name, handle, close = _upload_file(file, None)
        try:
            response = self._http.request(
                "POST",
                "/v1/checkpoints",
                files={"file": (upload_name, handle, "application/octet-stream")},
                data={"name": name},
                idempotency_key=idempotency_key or str(uuid.uuid4()),
            )
        finally:
            if close:
                handle.close()
        return Checkpoint.model_validate(response.json())

    def download(
        self, checkpoint: str | Checkpoint, to: str | os.PathLike[str], *, verify: bool = True
    ) -> Path:
        """Download a stored checkpoint (of any of your jobs) or uploaded weights by id to
        ``to`` (a file path, or an existing directory to put it in under its own name), checked
        against the server's sha256; returns the path."""
        from ace3.client.jobs import _FILENAME, _write_verified

        checkpoint_id = checkpoint.id if isinstance(checkpoint, Checkpoint) else checkpoint
        expected = checkpoint.sha256 if isinstance(checkpoint, Checkpoint) else None
        target = Path(to)
        with self._http.stream("GET", f"/v1/checkpoints/{checkpoint_id}/content") as response:
            if target.is_dir():
                match = _FILENAME.search(response.headers.get("content-disposition", ""))
                target = target / (Path(match.group(1)).name if match else f"{checkpoint_id}.pt")
            _write_verified(response, target, expected, verify=verify)
        return target

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
