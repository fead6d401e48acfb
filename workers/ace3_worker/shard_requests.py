"""Reading the engine's shard requests (``output/shard-requests/*.json``), which a job wrote:
untrusted input (docs/security.md).

The request directory is opened from the job's ``output/`` (which the worker made, in the
attempt directory the job cannot change) without following links; each file is opened
``O_NOFOLLOW | O_NONBLOCK`` and read only when it is a regular file with one link, at most
``REQUEST_MAX_BYTES + 1`` bytes of it. A file is read again only when it changed (inode, size
or mtime), and at most every ``REREAD_SECONDS``. A bad one (a link, a FIFO, too large, not
JSON, naming shards the job does not have, a name none of the attempt's readers writes, a split
the job does not stream) is reported once, as the worker's own line in the job's log, and
ignored: it never stops the feeder, and nothing in it is ever followed. A request is cut to its
first ``MAX_NAMES`` shards (the one its reader opens and ``LOOKAHEAD`` more), said once.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from ace3.config.shards import (
    REQUEST_DIR,
    REQUEST_LOOKAHEAD,
    REQUEST_MAX_BYTES,
    is_request_file_name,
    parse_request,
)

# The most directory entries looked at per pass (a job's readers write a few dozen).
MAX_REQUEST_ENTRIES = 1024
# The most bad request files reported per attempt (past it, one line says so).
MAX_REPORTED = 20
# The shards a reader names beyond the one it opens (shared with the engine's readers); the
# rest of a longer request is ignored.
LOOKAHEAD = REQUEST_LOOKAHEAD
MAX_NAMES = 1 + LOOKAHEAD
# A changed request file is read again at most this often.
REREAD_SECONDS = 0.05

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


@dataclass(frozen=True)
class Request:
    """One reader's valid request: its file name, split and the shard files it needs."""

    name: str
    split: str
    need: tuple[str, ...]


class BadRequest(ValueError):
    """A request file that is not one."""


def read_request_file(directory_fd: int, name: str, known: set[str]) -> tuple[str, ...]:
    """The shard files the request ``name`` (in the open directory) needs; raises
    :class:`BadRequest` saying what is wrong."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=directory_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise BadRequest("a symbolic link, not a file") from exc
        raise BadRequest(f"cannot be opened ({errno.errorcode.get(exc.errno or 0, exc)})") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadRequest("not a regular file")
        if info.st_nlink != 1:
            raise BadRequest(f"a file with {info.st_nlink} links (a hard link)")
        raw = bytearray()
        while len(raw) <= REQUEST_MAX_BYTES:
            chunk = os.read(fd, REQUEST_MAX_BYTES + 1 - len(raw))
            if not chunk:
                break
            raw += chunk
    except BlockingIOError as exc:
        raise BadRequest("not readable without blocking") from exc
    finally:
        os.close(fd)
    if len(raw) > REQUEST_MAX_BYTES:
        raise BadRequest(f"more than {REQUEST_MAX_BYTES} bytes")
    try:
        return tuple(parse_request(bytes(raw), known).need)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'request'}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)[:3]
        )
        raise BadRequest(f"not a shard request ({problems})") from exc
    except ValueError as exc:
        raise BadRequest(str(exc)[:300]) from exc


class RequestReader:
    """The current requests of one attempt, re-read as they change. ``known``: each streamed
    split's shard file names; ``expected``: the request file names the attempt's readers write
    (None: any); ``report``: where a bad request is said, once."""

    def __init__(
        self,
        output_dir: Path,
        known: dict[str, set[str]],
        report: Callable[[str], None],
        expected: frozenset[str] | None = None,
    ) -> None:
        self.output_dir = output_dir
        self.known = known
        self.expected = expected
        self.report = report
        self._seen: dict[str, tuple[tuple[int, int, int], tuple[str, ...] | None]] = {}
        self._read_at: dict[str, float] = {}
        self._cut: set[str] = set()
        self._reported = 0

    def _bad(self, name: str, why: str) -> None:
        self._reported += 1
        if self._reported <= MAX_REPORTED:
            self.report(f"ace3: ignored shard request {name[:80]!r}: {why}")
        elif self._reported == MAX_REPORTED + 1:
            self.report("ace3: more bad shard requests; they are ignored without a word")

    def _unexpected(self, name: str, split: str) -> str | None:
        """Why the file ``name`` is not one of the attempt's requests (None: it is)."""
        if not is_request_file_name(name):
            return "not a request file name (train|validation-r<rank>-w<n>.json)"
        if split not in self.known:
            return f"the job does not stream a {split} split"
        if self.expected is not None and name not in self.expected:
            return "no reader of this attempt writes it (another rank or num_workers)"
        return None

    def _cut_to_size(self, name: str, need: tuple[str, ...]) -> tuple[str, ...]:
        if len(need) > MAX_NAMES and name not in self._cut:
            self._cut.add(name)
            self._bad(name, f"names {len(need)} shards: only its first {MAX_NAMES} are fetched")
        return need[:MAX_NAMES]

    def read(self) -> list[Request]:
        """Every valid request now, in file name order."""
        try:
            output_fd = os.open(self.output_dir, _DIR_FLAGS)
        except OSError:
            return []
        try:
            try:
                directory_fd = os.open(REQUEST_DIR, _DIR_FLAGS, dir_fd=output_fd)
            except OSError:
                return []  # (not made yet by the job, or replaced by something else)
        finally:
            os.close(output_fd)
        try:
            return self._read(directory_fd)
        finally:
            os.close(directory_fd)

    def _read(self, directory_fd: int) -> list[Request]:
        names: list[str] = []
        with os.scandir(directory_fd) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_REQUEST_ENTRIES:
                    self._bad(REQUEST_DIR, f"more than {MAX_REQUEST_ENTRIES} entries")
                    break
                names.append(entry.name)
        requests = []
        seen: dict[str, tuple[tuple[int, int, int], tuple[str, ...] | None]] = {}
        for name in sorted(names):
            if name.startswith("."):
                continue  # (a reader's temporary file, renamed into place when written)
            split = name.partition("-")[0]
            why = self._unexpected(name, split)
            if why is not None:
                if name not in self._seen:
                    self._bad(name, why)
                seen[name] = ((0, 0, 0), None)
                continue
            try:
                info = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
            except OSError:
                continue
            key = (info.st_ino, info.st_size, info.st_mtime_ns)
            earlier = self._seen.get(name)
            now = time.monotonic()
            if earlier is not None and earlier[0] == key:
                need = earlier[1]
            elif earlier is not None and now - self._read_at.get(name, 0.0) < REREAD_SECONDS:
                key, need = earlier  # (read again on a later pass)
            else:
                self._read_at[name] = now
                try:
                    need = self._cut_to_size(
                        name, read_request_file(directory_fd, name, self.known[split])
                    )
                except BadRequest as exc:
                    self._bad(name, str(exc))
                    need = None
            seen[name] = (key, need)
            if need is not None:
                requests.append(Request(name, split, need))
        self._seen = seen
        return requests
