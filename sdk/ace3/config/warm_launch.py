"""What the worker and a warm launcher say to each other over the launcher's control socket.

A warm launcher (:mod:`ace3.runtime.process.warm_launcher`) runs in a job sandbox started before any
job was assigned to it. It imports torch, torchrun's agent and the engine, says so with one
:class:`LauncherReady` line, then waits for one :class:`WarmJob` line: torchrun's arguments and
the job's whole environment. It closes the socket when it has read that line, so nothing the
job runs later can write to the worker through it. One JSON object a line, each bounded: the
launcher writes :class:`LauncherStarted` as soon as it runs, then :class:`LauncherReady`.

Torch-free: the worker imports it.
"""

from __future__ import annotations

import socket
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# The longest line either side reads (a job's environment is an allow-list: small).
MAX_MESSAGE_BYTES = 1 << 20

_Text = Annotated[str, StringConstraints(max_length=65536)]
_Name = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^=\x00]+$")]


class LauncherStarted(BaseModel):
    """The launcher runs: the sandbox around it is set up (its bind mounts made)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["started"] = "started"


class LauncherReady(BaseModel):
    """The launcher imported everything and waits for its job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["ready"] = "ready"
    seconds: float = Field(ge=0, le=86400)  # how long the imports took


class WarmJob(BaseModel):
    """The job the launcher runs: torchrun's arguments (as the cold path's command line gives
    them to torchrun) and the ranks' whole environment (nothing of the launcher's stays)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["job"] = "job"
    argv: list[_Text] = Field(max_length=256)
    env: dict[_Name, _Text] = Field(max_length=1024)


def send_message(sock: socket.socket, message: LauncherStarted | LauncherReady | WarmJob) -> None:
    line = message.model_dump_json().encode() + b"\n"
    if len(line) > MAX_MESSAGE_BYTES:
        raise ValueError(f"a launcher message of {len(line)} bytes is too long")
    sock.sendall(line)


def read_line(sock: socket.socket) -> bytes:
    """One line (without its newline); b"" when the other side closed before sending one. Reads
    nothing past the newline (it peeks first), so the next line stays for the next call."""
    data = b""
    while True:
        peeked = sock.recv(65536, socket.MSG_PEEK)
        if not peeked:
            return b""
        end = peeked.find(b"\n")
        data += sock.recv(len(peeked) if end < 0 else end + 1)
        if len(data) > MAX_MESSAGE_BYTES:
            raise ValueError(f"a launcher message longer than {MAX_MESSAGE_BYTES} bytes")
        if data.endswith(b"\n"):
            return data[:-1]


def parse_started(line: bytes) -> LauncherStarted:
    return LauncherStarted.model_validate_json(line)


def parse_ready(line: bytes) -> LauncherReady:
    return LauncherReady.model_validate_json(line)


def parse_job(line: bytes) -> WarmJob:
    return WarmJob.model_validate_json(line)
