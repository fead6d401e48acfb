"""Fixtures and helpers for the end-to-end tests (the stack itself is in tests/conftest.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import ace3
from tests.conftest import Stack


@pytest.fixture(scope="session")
def client(stack: Stack) -> Iterator[ace3.Client]:
    key, _ = stack.create_key("e2e")
    with ace3.Client(api_key=key, base_url=stack.base_url) as client:
        yield client


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    name: str  # /proc/<pid>/comm
    cmdline: bytes
    environ: frozenset[bytes]
    cwd: str


def process_table() -> dict[int, ProcessInfo]:
    """Every live process of the machine (zombies, which have exited, left out)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            info = ProcessInfo(
                int(entry.name),
                int(stat[1]),
                (entry / "comm").read_text().strip(),
                (entry / "cmdline").read_bytes(),
                frozenset((entry / "environ").read_bytes().split(b"\0")),
                _cwd(entry),
            )
        except (OSError, IndexError, ValueError):
            continue
        if stat[0] != "Z":
            table[info.pid] = info
    return table


def _cwd(entry: Path) -> str:
    try:
        return os.readlink(entry / "cwd")
    except OSError:
        return ""


def processes_of_job(job_id: str) -> list[int]:
    """PIDs of a job's processes: its sandbox (whose command line, or for a sandbox prepared
    before its job was known, whose working directory names the job's directory: a warm
    sandbox's directory is moved there), everything below it (the ranks of a warm launcher
    are its forks, whose /proc environment is the launcher's first one), and anything else
    whose environment names the job (``ACE3_JOB_ID``, which a cold path's processes inherit)."""
    table = process_table()
    marker = f"ACE3_JOB_ID={job_id}".encode()
    found = {
        info.pid
        for info in table.values()
        if job_id.encode() in info.cmdline or marker in info.environ or f"/{job_id}/" in info.cwd
    }
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    below = list(found)
    while below:
        for child in children.get(below.pop(), []):
            if child not in found:
                found.add(child)
                below.append(child)
    return sorted(found)


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
