"""Where registered datasets may come from, and the client the service reads them with.

``ACE3_DATASET_SOURCES`` lists the bucket prefixes an administrator allowed; the API lists
objects under them when a dataset is registered and a worker fetches shards from them, both
with the service's own S3 settings (``ACE3_S3_ENDPOINT_URL``, ``AWS_*``), used for sources also
when the artifact store is local. No job ever gets these credentials.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ace3_control.settings import Settings


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> (``bucket``, ``some/prefix/``): the prefix ends in ``/``
    unless it is empty. Raises ``ValueError`` for anything that is not an s3:// URI."""
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri!r} is not an s3:// URI (s3://bucket/prefix/)")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} names no bucket (s3://bucket/prefix/)")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def allowed_sources(settings: Settings) -> list[tuple[str, str]]:
    """The allowed (bucket, prefix) pairs of ``ACE3_DATASET_SOURCES``; empty when unset."""
    raw = settings.dataset_sources or ""
    return [split_s3_uri(part.strip()) for part in raw.split(",") if part.strip()]


def source_client(settings: Settings) -> Any:
    """A boto3 S3 client with the service's settings: SigV4, path addressing for a custom
    endpoint (SeaweedFS, MinIO), retries; credentials from the environment, read now."""
    import os

    import boto3
    from botocore.config import Config

    endpoint = settings.s3_endpoint_url
    config = Config(
        s3={"addressing_style": "path"} if endpoint else {},
        signature_version="s3v4",
        retries={"max_attempts": 5, "mode": "standard"},
    )
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name=region, config=config
    )
