"""The boto3 S3 client the service reads dataset sources with (registration's listing and footer
reads, the worker's shard fetches): its own settings and the environment's credentials, never a
job's."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ace3_control.settings import Settings

# Connections per client: registration reads up to 8 parquet footers at once
# (dataset_sources.FOOTER_READERS), the worker's fetches up to 6 ranges of a shard.
MAX_POOL_CONNECTIONS = 16

# Made once per endpoint and credentials (building a client reads botocore's service models:
# 60-150 ms, which every registration paid); boto3's clients are thread-safe.
_ENVIRONMENT_VARIABLES = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_REGION", "AWS_DEFAULT_REGION",
)  # fmt: skip
_MAX_CLIENTS = 8
_clients: dict[tuple[str | None, ...], Any] = {}
_clients_lock = threading.Lock()


def source_client(settings: Settings) -> Any:
    """A boto3 S3 client with the service's settings: SigV4, path addressing for a custom
    endpoint (SeaweedFS, MinIO), retries; credentials from the environment. The same client
    while the endpoint and the environment's AWS variables stay the same (a change makes a
    new one)."""
    key = (settings.s3_endpoint_url, *(os.environ.get(name) for name in _ENVIRONMENT_VARIABLES))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            if len(_clients) >= _MAX_CLIENTS:
                _clients.clear()
            client = _clients[key] = _new_source_client(settings.s3_endpoint_url)
        return client


def _new_source_client(endpoint: str | None) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        s3={"addressing_style": "path"} if endpoint else {},
        signature_version="s3v4",
        retries={"max_attempts": 5, "mode": "standard"},
        max_pool_connections=MAX_POOL_CONNECTIONS,
    )
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name=region, config=config
    )
