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


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains ``text`` (the job id is in every rank's job.json path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
