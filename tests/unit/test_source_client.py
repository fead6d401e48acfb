"""The service's S3 client for dataset sources is made once per endpoint and credentials: a
registration no longer builds one (60-150 ms of botocore's models each), and a change of the
endpoint or of the environment's AWS variables gets a client of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from ace3_control.settings import Settings
from ace3_control.source_client import source_client


def test_the_same_endpoint_and_credentials_share_one_client(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    settings = Settings(data_dir=tmp_path, s3_endpoint_url="http://127.0.0.1:1")
    client = source_client(settings)
    assert source_client(settings) is client
    assert client.meta.endpoint_url == "http://127.0.0.1:1"

    other_endpoint = source_client(
        Settings(data_dir=tmp_path, s3_endpoint_url="http://127.0.0.1:2")
    )
    assert other_endpoint is not client and other_endpoint.meta.endpoint_url.endswith(":2")

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second")
    rotated = source_client(settings)
    assert rotated is not client
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "first")
    assert source_client(settings) is client
