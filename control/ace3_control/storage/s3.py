"""An S3-compatible object store (AWS S3, MinIO, SeaweedFS, Cloudflare R2...) through boto3.

boto3 because it is the reference client every S3-compatible server tests against, it reads
the standard ``AWS_*`` credentials itself, and its transfer manager does multipart uploads
(``upload_file`` with a :class:`TransferConfig`) and retries without code of ours.

Offered bytes are first spooled to a local staging file while hashed and capped, so an object
appears only once its size and sha256 are checked (a failed check leaves nothing in the
bucket). A tree is stored as one uncompressed tar object under its ``.../tree`` key and
extracted on fetch with tarfile's ``data`` filter (nothing outside the target), then checked
against the digest recorded when it was stored (:mod:`ace3_control.storage.trees`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from ace3_control.storage.base import (
    KeyFor,
    Readable,
    StoredBlob,
    StoredDigestError,
    check_key,
    check_prefix,
    check_tree_key,
    copy_verified,
    is_tree_key,
    iter_handle,
    spool,
    verify_digest,
)
from ace3_control.storage.trees import verify_tree

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig


class StoreUnavailableError(RuntimeError):
    """The object store cannot be reached or refuses these credentials (at startup)."""


class UploadRefusedError(ValueError):
    """The store refused to complete (or find) a presigned multipart upload: its reason."""


MULTIPART_BYTES = 16 << 20  # multipart upload past this, in parts of this size


def _missing(exc: Exception) -> bool:
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return False
    code = str(exc.response.get("Error", {}).get("Code", ""))
    return code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket")


class S3ArtifactStore:
    """Objects under ``s3://<bucket>/<prefix>``; the bucket is created when missing."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        *,
        staging_root: Path,
        endpoint_url: str | None = None,
        region: str | None = None,
        public_endpoint_url: str | None = None,
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.region = region or "us-east-1"
        # Path-style addressing for non-AWS endpoints (no wildcard DNS for bucket names there).
        addressing = {"addressing_style": "path"} if endpoint_url else {}
        # SigV4 everywhere, presigned URLs included (botocore would presign with SigV2 for a
        # custom endpoint, which SeaweedFS and new AWS regions refuse).
        config = Config(
            s3=addressing,
            signature_version="s3v4",
            retries={"max_attempts": 5, "mode": "standard"},
        )
        # A session of its own: credentials are read from the environment now (boto3's
        # default session keeps the first ones it found for the process's lifetime).
        session = boto3.session.Session()
        self.client = session.client(
            "s3", endpoint_url=endpoint_url, region_name=self.region, config=config
        )
        self._presigner = (
            session.client(
                "s3", endpoint_url=public_endpoint_url, region_name=self.region, config=config
            )
            if public_endpoint_url
            else self.client
        )
        self.transfer: TransferConfig = TransferConfig(
            multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES
        )
        self._staging = staging_root.resolve() / ".staging"
        self._ensure_bucket()

    def _ensure_bucket(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        where = f"s3://{self.bucket} at {self.client.meta.endpoint_url}"
        try:
            self.client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as exc:
            if not _missing(exc):
                raise StoreUnavailableError(
                    f"the artifact store {where} refused access ({exc}): check "
                    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and ACE3_STORAGE_URL"
                ) from exc
        except BotoCoreError as exc:  # (unreachable, no credentials at all...)
            raise StoreUnavailableError(
                f"the artifact store {where} cannot be used ({exc}): check "
                "ACE3_S3_ENDPOINT_URL and the AWS_* credentials"
            ) from exc
        options: dict[str, Any] = {}
        if self.region != "us-east-1":
            options["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            self.client.create_bucket(Bucket=self.bucket, **options)
        except ClientError as exc:  # (another process created it meanwhile)
            code = exc.response.get("Error", {}).get("Code")
            if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def _name(self, key: str) -> str:
        check_key(key)
        return self.prefix + key

    def staging_dir(self) -> Path:
        self._staging.mkdir(parents=True, exist_ok=True)
        return self._staging

    def _head(self, key: str) -> dict[str, Any] | None:
        try:
            return cast(
                dict[str, Any], self.client.head_object(Bucket=self.bucket, Key=self._name(key))
            )
        except Exception as exc:
            if _missing(exc):
                return None
            raise

    def exists(self, key: str) -> bool:
        return self._head(key) is not None

    def size(self, key: str) -> int:
        head = self._head(key)
        if head is None:
            raise FileNotFoundError(f"{key} is missing from the artifact store")
        return int(head["ContentLength"])

    def _upload(self, path: Path, key: str, sha256: str | None = None) -> None:
        extra = {"Metadata": {"sha256": sha256}} if sha256 else None
        self.client.upload_file(
            str(path), self.bucket, self._name(key), ExtraArgs=extra, Config=self.transfer
        )

    def put_file(self, key: str, source: Path) -> None:
        """Upload the file ``source`` to ``key``; a directory (a tree) is uploaded as one tar
        object and consumed (removed) like the local store's move."""
        self._name(key)
        if not source.is_dir():
            self._upload(source, key)
            return
        check_tree_key(key)
        try:
            if self.exists(key):
                return
            fd, name = tempfile.mkstemp(dir=self.staging_dir(), prefix="tree-", suffix=".tar")
            os.close(fd)
            try:
                with tarfile.open(name, "w") as tar:
                    for child in sorted(source.iterdir()):
                        tar.add(child, arcname=child.name)
                self._upload(Path(name), key)
            finally:
                Path(name).unlink(missing_ok=True)
        finally:
            shutil.rmtree(source, ignore_errors=True)

    def put_stream(
        self, key: str, source: BinaryIO, *, max_bytes: int | None = None, sha256: str | None = None
    ) -> StoredBlob:
        self._name(key)
        spooled = spool(source, self.staging_dir(), max_bytes)
        verify_digest(spooled, sha256, key)
        try:
            self._upload(spooled.path, key, spooled.sha256)
        finally:
            spooled.path.unlink(missing_ok=True)
        return StoredBlob(key, spooled.sha256, spooled.size_bytes)

    def put_hashed(
        self, source: Readable, key_for: KeyFor, *, max_bytes: int | None = None
    ) -> StoredBlob:
        spooled = spool(source, self.staging_dir(), max_bytes)
        try:
            key = key_for(spooled.sha256)
            if not self.exists(key):
                self._upload(spooled.path, key, spooled.sha256)
        finally:
            spooled.path.unlink(missing_ok=True)
        return StoredBlob(key, spooled.sha256, spooled.size_bytes)

    def open(self, key: str) -> BinaryIO:
        """A stream of the object's bytes (FileNotFoundError when there is none)."""
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._name(key))
        except Exception as exc:
            if _missing(exc):
                raise FileNotFoundError(f"{key} is missing from the artifact store") from exc
            raise
        return cast(BinaryIO, response["Body"])

    def iter_bytes(self, key: str) -> Iterator[bytes]:
        return iter_handle(self.open(key))

    def fetch(self, key: str, target: Path, sha256: str | None = None) -> Path:
        """Download the object or extract the tree into the new path ``target``, verified
        against ``sha256`` (a tree's: its :func:`~ace3_control.storage.trees.tree_digest`);
        on a mismatch nothing is left at ``target`` and :class:`StoredDigestError` names the
        key."""
        with self.open(key) as body:
            if not is_tree_key(key):
                copy_verified(body, target, sha256, key)
                return target
            target.mkdir(parents=True)
            try:
                with tarfile.open(fileobj=body, mode="r|") as tar:
                    tar.extractall(target, filter="data")
            except tarfile.TarError as exc:  # (FilterError: a link out, a device...)
                shutil.rmtree(target, ignore_errors=True)
                raise StoredDigestError(f"stored tree {key} is not a tree it wrote: {exc}") from exc
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
        verify_tree(target, sha256, key)
        return target

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.client.delete_object(Bucket=self.bucket, Key=self._name(key))

    def list(self, prefix: str) -> list[str]:
        check_prefix(prefix)
        paginator = self.client.get_paginator("list_objects_v2")
        found: list[str] = []
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
            found += [item["Key"][len(self.prefix) :] for item in page.get("Contents", [])]
        return sorted(found)

    def presigned_url(
        self, key: str, content_disposition: str, expires_seconds: int = 300
    ) -> str | None:
        """A time-limited GET URL for the object, served with this ``Content-Disposition``."""
        params = {
            "Bucket": self.bucket,
            "Key": self._name(key),
            "ResponseContentDisposition": content_disposition,
        }
        return str(
            self._presigner.generate_presigned_url(
                "get_object", Params=params, ExpiresIn=expires_seconds
            )
        )

    # -- presigned multipart uploads: the bytes go from the client straight to the store ----

    def start_upload(
        self, key: str, part_sizes: Sequence[int], expires_seconds: int
    ) -> tuple[str, Sequence[str]]:
        """Start a multipart upload to ``key``: (its upload id, one presigned ``PUT`` URL per
        part, in order). Each URL is signed for its part's exact ``Content-Length``, so a part
        of another size is refused by the store."""
        name = self._name(key)
        upload_id = str(
            self.client.create_multipart_upload(Bucket=self.bucket, Key=name)["UploadId"]
        )
        urls = [
            str(
                self._presigner.generate_presigned_url(
                    "upload_part",
                    Params={
                        "Bucket": self.bucket,
                        "Key": name,
                        "UploadId": upload_id,
                        "PartNumber": number,
                        "ContentLength": size,
                    },
                    ExpiresIn=expires_seconds,
                )
            )
            for number, size in enumerate(part_sizes, start=1)
        ]
        return upload_id, urls

    def complete_upload(self, key: str, upload_id: str, etags: Sequence[str]) -> None:
        """Complete the multipart upload of ``key`` from its parts' ETags (part 1 first).
        :class:`UploadRefusedError` with the store's reason when it refuses (no such upload, a
        part missing or not the one uploaded)."""
        from botocore.exceptions import ClientError

        parts = [{"PartNumber": n, "ETag": etag} for n, etag in enumerate(etags, start=1)]
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=self._name(key),
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )
        except ClientError as exc:
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if 400 <= status < 500:
                error = exc.response.get("Error", {})
                raise UploadRefusedError(f"{error.get('Code')}: {error.get('Message')}") from exc
            raise

    def abort_upload(self, key: str, upload_id: str) -> None:
        """Abort the multipart upload (its parts are freed); nothing when there is none."""
        from botocore.exceptions import ClientError

        try:
            self.client.abort_multipart_upload(
                Bucket=self.bucket, Key=self._name(key), UploadId=upload_id
            )
        except ClientError as exc:
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            if status != 404 and not _missing(exc):
                raise

    def copy(self, source_key: str, key: str) -> None:
        """Copy the object ``source_key`` to ``key`` inside the store (no byte leaves it;
        a multipart copy for large objects)."""
        self.client.copy(
            {"Bucket": self.bucket, "Key": self._name(source_key)},
            self.bucket,
            self._name(key),
            Config=self.transfer,
        )
