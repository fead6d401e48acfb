"""The artifact store: models, datasets, checkpoints and job artifacts behind one interface of
keys and streams (:class:`ArtifactStore`), on the local filesystem (the embedded default) or an
S3-compatible object store (``ACE3_STORAGE_URL=s3://bucket/prefix``)."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from ace3_control.settings import Settings
from ace3_control.storage.base import (
    ArtifactStore,
    StoredBlob,
    StoredDigestError,
    StoredTooLargeError,
    is_tree_key,
)
from ace3_control.storage.local import LocalArtifactStore
from ace3_control.storage.trees import tree_digest

__all__ = [
    "ArtifactStore",
    "LocalArtifactStore",
    "StoredBlob",
    "StoredDigestError",
    "StoredTooLargeError",
    "is_tree_key",
    "open_store",
    "parse_storage_url",
    "tree_digest",
]


def parse_storage_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` as (bucket, prefix); ValueError naming the setting otherwise."""
    parts = urlsplit(url)
    bucket = parts.netloc
    if parts.scheme != "s3" or not bucket or parts.query or parts.fragment:
        raise ValueError(
            f"ACE3_STORAGE_URL={url!r} is not s3://<bucket>[/<prefix>] (leave it unset for the "
            "local directory ACE3_STORAGE_DIR)"
        )
    if not 3 <= len(bucket) <= 63:
        raise ValueError(f"ACE3_STORAGE_URL: bucket name {bucket!r} must be 3 to 63 characters")
    return bucket, parts.path.strip("/")


def open_store(settings: Settings) -> ArtifactStore:
    """The store the settings name: S3 when ``storage_url`` is set (``storage_dir`` then only
    holds staging files), else the local directory."""
    if not settings.storage_url:
        return LocalArtifactStore(settings.resolved_storage_dir)
    from ace3_control.storage.s3 import S3ArtifactStore

    bucket, prefix = parse_storage_url(settings.storage_url)
    return S3ArtifactStore(
        bucket,
        prefix,
        staging_root=settings.resolved_storage_dir,
        endpoint_url=settings.s3_endpoint_url,
        region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
        public_endpoint_url=settings.s3_public_endpoint_url,
    )
