"""``ace3 up --workers 2`` on the embedded defaults (SQLite and the filesystem broker in a
temporary ACE3_DATA_DIR): two workers register, each as its own worker, with the CPU process cap
that admits the document's num_gpus=8 snippets; SIGTERM stops everything cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

pytestmark = pytest.mark.slow


def test_up_starts_n_workers_that_register_apart(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("ACE3_")}
    env |= {"ACE3_DATA_DIR": str(tmp_path), "ACE3_HEARTBEAT_SECONDS": "1"}
    port = free_port()
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen(
        [sys.executable, "-m", "ace3.cli", "up", "--port", str(port), "--workers", "2"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        workers: list[dict] = []
        key = None
        while time.monotonic() < deadline and len(workers) < 2:
            assert up.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            time.sleep(0.5)
            try:
                if key is None:
                    httpx.get(f"{base}/healthz", timeout=2).raise_for_status()
                    created = subprocess.run(
                        [sys.executable, "-m", "ace3.cli", "keys", "create", "--name", "up",
                         "--quiet"],
                        env=env, capture_output=True, text=True, timeout=60, check=True,
                    )  # fmt: skip
                    key = created.stdout.strip()
                response = httpx.get(
                    f"{base}/v1/workers", headers={"Authorization": f"Bearer {key}"}, timeout=5
                )
                workers = response.json()["data"]
            except httpx.HTTPError:
                continue
        text = (tmp_path / "up.log").read_text()
        assert len(workers) == 2, text[-3000:]
        assert len({worker["id"] for worker in workers}) == 2
        assert [worker["device_count"] for worker in workers] == [8, 8]
        assert "oversubscribed" in text and "2 worker(s)" in text
        assert "DuplicateNodenameWarning" not in text
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            code = up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            raise
        log.close()
    assert code == 0, (tmp_path / "up.log").read_text()[-3000:]
