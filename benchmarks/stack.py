"""A running ACE3 for the benchmarks: ACE3_BASE_URL + ACE3_API_KEY if both are set, else
``ace3 up`` (embedded SQLite + filesystem broker) in a temporary directory, stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


@contextlib.contextmanager
def service(extra_env: dict[str, str] | None = None) -> Iterator[tuple[str, str]]:
    if os.environ.get("ACE3_BASE_URL") and os.environ.get("ACE3_API_KEY"):
        yield os.environ["ACE3_BASE_URL"], os.environ["ACE3_API_KEY"]
        return
    with tempfile.TemporaryDirectory() as data_dir:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = {**os.environ, "ACE3_DATA_DIR": data_dir, **(extra_env or {})}
        cli = [sys.executable, "-m", "ace3.cli"]
        log = open(Path(data_dir) / "stack.log", "wb")  # noqa: SIM115 - closed below
        stack = subprocess.Popen(
            [*cli, "up", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        base_url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                        break
                time.sleep(0.3)
            key = subprocess.run(
                [*cli, "keys", "create", "--name", "bench", "--quiet"],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            yield base_url, key
        finally:
            stack.terminate()
            stack.wait(timeout=60)
            log.close()
