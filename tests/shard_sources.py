"""Shards in a real S3 bucket (the session's SeaweedFS) for the dataset registration tests: a
boto3 client with the store's credentials, a bucket of their own, and small shards of each
format."""

from __future__ import annotations

import io
import json
import secrets
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from tests.object_store import ObjectStore


def s3_client(store: ObjectStore) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=store.endpoint_url,
        aws_access_key_id=store.access_key,
        aws_secret_access_key=store.secret_key,
        region_name="us-east-1",
    )


def new_bucket(client: Any, stem: str = "sources") -> str:
    bucket = f"{stem}-{secrets.token_hex(4)}"
    client.create_bucket(Bucket=bucket)
    return bucket


@contextmanager
def source_credentials(store: ObjectStore) -> Iterator[None]:
    """The store's AWS_* credentials in this process's environment (the service reads sources
    with the environment's, as ``source_client`` does)."""
    env = {name: value for name, value in store.env("unused").items() if name.startswith("AWS_")}
    with mock.patch.dict("os.environ", env):
        yield


def parquet_bytes(rows: int, inputs: str = "inputs", targets: str = "targets") -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            inputs: [[float(i), float(i) + 0.5] for i in range(rows)],
            targets: list(range(rows)),
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=max(1, rows // 2))
    return buffer.getvalue()


def jsonl_bytes(rows: int) -> bytes:
    return b"".join(
        json.dumps({"inputs": [i, i + 1], "targets": i % 2}).encode() + b"\n" for i in range(rows)
    )


def tar_bytes(samples: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for index in range(samples):
            for extension, data in (("txt", f"sample {index}".encode()), ("cls", b"1")):
                info = tarfile.TarInfo(f"{index:04d}.{extension}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def tokens_bytes(count: int, itemsize: int = 2) -> bytes:
    return b"".join(index.to_bytes(itemsize, "little") for index in range(count))


def put(client: Any, bucket: str, objects: dict[str, bytes]) -> None:
    for key, data in objects.items():
        client.put_object(Bucket=bucket, Key=key, Body=data)
