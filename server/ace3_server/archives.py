"""Safe extraction of uploaded archives (tar, tar.gz, zip).

Only regular files and directories are extracted. Absolute paths, ``..`` components, links,
devices and archives that would grow past a size budget are refused before anything is written.
"""

from __future__ import annotations

import shutil
import stat
import tarfile
import zipfile
from pathlib import Path, PurePosixPath


class UnsafeArchiveError(ValueError):
    """The archive is not acceptable; the message says which member and why."""


def _check_member_name(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or name.startswith(("/", "\\")) or ":" in path.parts[0]:
        raise UnsafeArchiveError(f"archive member {name!r}: absolute paths are not allowed")
    if any(part == ".." for part in path.parts):
        raise UnsafeArchiveError(f"archive member {name!r}: '..' path components are not allowed")
    return path


def is_archive_name(filename: str) -> bool:
    lowered = filename.lower()
    return lowered.endswith((".tar.gz", ".tgz", ".tar", ".zip"))


def _extract_tar(archive: Path, dest: Path, max_total_bytes: int) -> int:
    total = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for member in members:
                _check_member_name(member.name)
                if not (member.isfile() or member.isdir()):
                    raise UnsafeArchiveError(
                        f"archive member {member.name!r}: only regular files and directories are "
                        "allowed (no links or devices)"
                    )
                total += member.size
                if total > max_total_bytes:
                    raise UnsafeArchiveError(
                        f"archive extracts to more than {max_total_bytes} bytes"
                    )
            for member in members:
                target = dest / member.name
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                if source is None:  # pragma: no cover - isfile() members always have data
                    raise UnsafeArchiveError(f"archive member {member.name!r} has no data")
                with source, target.open("wb") as out:
                    shutil.copyfileobj(source, out)
    except tarfile.TarError as exc:
        raise UnsafeArchiveError(f"not a readable tar archive: {exc}") from exc
    return total


def _extract_zip(archive: Path, dest: Path, max_total_bytes: int) -> int:
    total = 0
    try:
        with zipfile.ZipFile(archive) as zipped:
            infos = zipped.infolist()
            for info in infos:
                _check_member_name(info.filename)
                mode = info.external_attr >> 16
                if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise UnsafeArchiveError(
                        f"archive member {info.filename!r}: only regular files and directories "
                        "are allowed (no links or devices)"
                    )
                total += info.file_size
                if total > max_total_bytes:
                    raise UnsafeArchiveError(
                        f"archive extracts to more than {max_total_bytes} bytes"
                    )
            for info in infos:
                target = dest / info.filename
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zipped.open(info) as source, target.open("wb") as out:
                    shutil.copyfileobj(source, out)
    except zipfile.BadZipFile as exc:
        raise UnsafeArchiveError(f"not a readable zip archive: {exc}") from exc
    return total


def safe_extract(archive: Path, dest: Path, *, filename: str, max_total_bytes: int) -> int:
    """Extract ``archive`` into the empty directory ``dest``; return the extracted byte count."""
    dest.mkdir(parents=True, exist_ok=True)
    if filename.lower().endswith(".zip"):
        return _extract_zip(archive, dest, max_total_bytes)
    return _extract_tar(archive, dest, max_total_bytes)
