"""Safe extraction of uploaded archives (tar, tar.gz/.bz2/.xz, zip).

Only regular files and directories are extracted. Absolute paths, ``..`` components, links and
devices are refused, and so are archive bombs, while extracting and before the work is done:
more than ``max_members`` members, more than ``max_total_bytes`` of files, a compressed tar
that decompresses to more than ``MAX_COMPRESSION_RATIO`` times its size (beyond a floor), or
tar metadata records (long names, pax headers) larger than ``MAX_TAR_HEADER_BYTES``. On any
refusal nothing extracted is left behind.
"""

from __future__ import annotations

import bz2
import errno
import gzip
import lzma
import shutil
import stat
import tarfile
import zipfile
import zlib
from io import BufferedIOBase
from pathlib import Path, PurePosixPath
from typing import IO

DEFAULT_MAX_MEMBERS = 100_000
MAX_COMPRESSION_RATIO = 100
RATIO_FLOOR_BYTES = 64 << 20
"""Archives that decompress to less than this are never refused for their ratio."""
MAX_TAR_HEADER_BYTES = 1 << 20
TAR_OVERHEAD_BYTES = 10 * 1024
"""Headers and padding a tar may add per member, on top of its files' bytes."""
COPY_CHUNK_BYTES = 1 << 20

_CORRUPT_DATA_ERRORS = (
    OSError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    zipfile.BadZipFile,
    NotImplementedError,
)


_SERVER_SIDE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


class UnsafeArchiveError(ValueError):
    """The archive is not acceptable; the message says which member and why."""


def _check_member_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or name.startswith(("/", "\\")) or ":" in path.parts[0]:
        raise UnsafeArchiveError(f"archive member {name!r}: absolute paths are not allowed")
    if any(part == ".." for part in path.parts):
        raise UnsafeArchiveError(f"archive member {name!r}: '..' path components are not allowed")
    if "\x00" in name:
        raise UnsafeArchiveError(f"archive member {name!r}: NUL characters are not allowed")
    return path


def is_archive_name(filename: str) -> bool:
    lowered = filename.lower()
    return lowered.endswith((".tar.gz", ".tgz", ".tar", ".zip"))


class _Budget:
    """Counts members and bytes against the archive's limits; raises when one is passed."""

    def __init__(self, max_members: int, max_total_bytes: int) -> None:
        self.max_members = max_members
        self.max_total_bytes = max_total_bytes
        self.members = 0
        self.total_bytes = 0

    def add_member(self, name: str, size: int) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise UnsafeArchiveError(f"archive has more than {self.max_members} members")
        self.total_bytes += size
        if self.total_bytes > self.max_total_bytes:
            raise UnsafeArchiveError(
                f"archive extracts to more than {self.max_total_bytes} bytes (at member {name!r})"
            )


def _read_checked(source: IO[bytes] | BufferedIOBase, size: int) -> bytes:
    """``source.read(size)``, with corrupt compressed data reported as an unreadable archive."""
    try:
        return source.read(size)
    except _CORRUPT_DATA_ERRORS as exc:
        raise UnsafeArchiveError(
            f"not a readable archive: its compressed data is corrupt ({type(exc).__name__})"
        ) from exc


class _CappedReader:
    """A decompressed stream that refuses to yield more than ``limit`` bytes."""

    def __init__(self, stream: BufferedIOBase, limit: int) -> None:
        self.stream = stream
        self.limit = limit
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        allowed = self.limit - self.consumed + 1
        chunk = _read_checked(self.stream, allowed if size < 0 else min(size, allowed))
        self.consumed += len(chunk)
        if self.consumed > self.limit:
            raise UnsafeArchiveError(
                f"archive decompresses to more than {self.limit} bytes: refused as a "
                "compression bomb"
            )
        return chunk


def _decompressed(archive: Path) -> BufferedIOBase:
    with archive.open("rb") as probe:
        magic = probe.read(6)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.open(archive, "rb")
    if magic.startswith(b"BZh"):
        return bz2.open(archive, "rb")
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.open(archive, "rb")
    return archive.open("rb")


_METADATA_TYPES = frozenset(
    {
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
    }
)


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses metadata records (GNU long names, pax headers) too large to be honest: tarfile
    reads each one whole into memory."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _METADATA_TYPES and self.size > MAX_TAR_HEADER_BYTES:
            raise UnsafeArchiveError(
                f"archive has a {self.size}-byte metadata record (long name or pax header); at "
                f"most {MAX_TAR_HEADER_BYTES} bytes are allowed"
            )
        return super()._proc_member(tarfile_)  # type: ignore[misc]  # a private hook (not in the stubs), unchanged since Python 2.6


def _write_member(source: IO[bytes], target: Path, name: str, size_limit: int) -> None:
    """Copy one member's bytes, refusing more than its declared size."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as out:
            written = 0
            for chunk in iter(lambda: _read_checked(source, COPY_CHUNK_BYTES), b""):
                written += len(chunk)
                if written > size_limit:
                    raise UnsafeArchiveError(f"archive member {name!r} is larger than declared")
                out.write(chunk)
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
        raise UnsafeArchiveError(
            f"archive member {name!r} collides with another member of the same path"
        ) from exc
    except OSError as exc:
        if exc.errno in _SERVER_SIDE_ERRNOS:
            raise
        raise UnsafeArchiveError(
            f"archive member {name!r} cannot be extracted: {exc.strerror}"
        ) from exc


def _make_dir(target: Path, name: str) -> None:
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UnsafeArchiveError(
            f"archive member {name!r} collides with another member of the same path"
        ) from exc


def _extract_tar(archive: Path, dest: Path, budget: _Budget) -> None:
    """Read the tar as one stream, member by member: each is checked before its bytes are read,
    and the decompressed stream is capped so no header or padding trick costs more."""
    stream_limit = min(
        max(RATIO_FLOOR_BYTES, MAX_COMPRESSION_RATIO * archive.stat().st_size),
        budget.max_total_bytes + TAR_OVERHEAD_BYTES * (budget.max_members + 1),
    )
    try:
        with _decompressed(archive) as raw:
            reader = _CappedReader(raw, stream_limit)
            with tarfile.open(fileobj=reader, mode="r|", tarinfo=_BoundedTarInfo) as tar:  # type: ignore[call-overload]  # the stubs want a seekable, writable file; "r|" only reads
                for member in tar:
                    _check_member_name(member.name)
                    if not (member.isfile() or member.isdir()):
                        raise UnsafeArchiveError(
                            f"archive member {member.name!r}: only regular files and "
                            "directories are allowed (no links or devices)"
                        )
                    budget.add_member(member.name, member.size)
                    target = dest / member.name
                    if member.isdir():
                        _make_dir(target, member.name)
                        continue
                    source = tar.extractfile(member)
                    if source is None:  # pragma: no cover - isfile() members always have data
                        raise UnsafeArchiveError(f"archive member {member.name!r} has no data")
                    _write_member(source, target, member.name, member.size)
    except tarfile.TarError as exc:
        raise UnsafeArchiveError(f"not a readable tar archive: {exc}") from exc


def _zip_member_is_safe(info: zipfile.ZipInfo) -> bool:
    """Regular files and directories. Members without file-type bits (Python's ``writestr``,
    archives made on Windows) count as what their name says."""
    file_type = stat.S_IFMT(info.external_attr >> 16)
    return file_type in (0, stat.S_IFREG, stat.S_IFDIR)


def _extract_zip(archive: Path, dest: Path, budget: _Budget) -> None:
    try:
        with zipfile.ZipFile(archive) as zipped:
            infos = zipped.infolist()
            if len(infos) > budget.max_members:
                raise UnsafeArchiveError(f"archive has more than {budget.max_members} members")
            for info in infos:
                _check_member_name(info.filename)
                if not _zip_member_is_safe(info):
                    raise UnsafeArchiveError(
                        f"archive member {info.filename!r}: only regular files and directories "
                        "are allowed (no links or devices)"
                    )
                budget.add_member(info.filename, info.file_size)
            for info in infos:
                target = dest / info.filename
                if info.is_dir():
                    _make_dir(target, info.filename)
                    continue
                with zipped.open(info) as source:
                    _write_member(source, target, info.filename, info.file_size)
    except (zipfile.BadZipFile, NotImplementedError) as exc:
        raise UnsafeArchiveError(f"not a readable zip archive: {exc}") from exc


def _clear(dest: Path) -> None:
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def safe_extract(
    archive: Path,
    dest: Path,
    *,
    filename: str,
    max_total_bytes: int,
    max_members: int = DEFAULT_MAX_MEMBERS,
) -> int:
    """Extract ``archive`` into the empty directory ``dest``; return the extracted byte count.
    On refusal, ``dest`` is left empty and :class:`UnsafeArchiveError` says why."""
    dest.mkdir(parents=True, exist_ok=True)
    budget = _Budget(max_members, max_total_bytes)
    extract = _extract_zip if filename.lower().endswith(".zip") else _extract_tar
    try:
        extract(archive, dest, budget)
    except BaseException:
        _clear(dest)
        raise
    return budget.total_bytes
