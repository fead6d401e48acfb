"""Fixtures and helpers for the end-to-end tests (the stack itself is in tests/conftest.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import ace3
from tests.conftest import Stack


@pytest.fixture(scope="session")
def client(stack: Stack) -> Iterator[ace3.Client]:
    key, _ = stack.create_key("e2e")
    with ace3.Client(api_key=key, base_url=stack.base_url) as client:
        yield client


def processes_of_job(job_id: str) -> list[int]:
    """PIDs of a job's processes: its sandbox (whose command line names the job's directory)
    and everything inside it (the ranks and whatever they started inherit ``ACE3_JOB_ID``)."""
    marker = f"ACE3_JOB_ID={job_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == "Z":
            continue  # (exited, waiting for its parent to read its status)
        if job_id.encode() in cmdline or marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
