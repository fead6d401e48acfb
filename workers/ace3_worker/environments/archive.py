"""An environment as the artifact store holds it: one ``tar.gz`` of its tree under a
content-addressed key, ``environments/<hash>/<sha256>.tar.gz``, its sha256 recorded in the
environments row and checked by every worker that fetches it.

The key names the archive's own bytes because two builds of one environment never give the
same bytes (mtimes, gzip's header): a builder that lost its lease and uploads late then writes
beside the row's archive, never over it. Unpacking uses tarfile's ``data`` filter (no absolute
paths, no ``..``, no link leading out of the tree, no device files) and refuses an archive whose
members add up to more than ``ACE3_ENV_MAX_BYTES``; an archive that cannot be read (truncated,
not gzip, a member the filter refuses) raises :class:`BrokenArchiveError`, which the preparer
treats like a missing archive (it builds the environment again)."""

from __future__ import annotations

import gzip
import os
import re
import tarfile
import zlib
from pathlib import Path

from ace3.files import sha256_file

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class BrokenArchiveError(ValueError):
    """The stored archive cannot be unpacked: it is not a whole, well-formed tar.gz."""


class ArchiveTooLargeError(ValueError):
    """The archive unpacks to more than this worker's ``ACE3_ENV_MAX_BYTES``."""


def storage_key(environment_hash: str, sha256: str) -> str:
    """Where the store keeps the archive of ``environment_hash`` whose bytes hash to
    ``sha256``."""
    if not (_SHA256.match(environment_hash) and _SHA256.match(sha256)):
        raise ValueError(f"not a hash: {environment_hash!r}, {sha256!r}")
    return f"environments/{environment_hash}/{sha256}.tar.gz"


def pack(tree: Path, archive: Path) -> tuple[str, int]:
    """Write ``tree``'s contents (paths relative to it, in a stable order) as ``archive``; its
    sha256 and size."""
    with tarfile.open(archive, "w:gz", compresslevel=6) as output:
        for directory, subdirectories, names in os.walk(tree):
            subdirectories.sort()
            for name in sorted([*subdirectories, *names]):
                path = Path(directory) / name
                member = output.gettarinfo(str(path), arcname=str(path.relative_to(tree)))
                member.uid = member.gid = 0
                member.uname = member.gname = ""
                if member.isfile():
                    with path.open("rb") as handle:
                        output.addfile(member, handle)
                else:
                    output.addfile(member)
    return sha256_file(archive), archive.stat().st_size


def unpack(archive: Path, into: Path, max_bytes: int) -> int:
    """Extract ``archive`` into the new directory ``into``; the bytes its files hold. Raises
    :class:`BrokenArchiveError` for an archive that cannot be read whole and
    :class:`ArchiveTooLargeError` past ``max_bytes``; other OSErrors (the disk full) pass."""
    into.mkdir(mode=0o700)
    try:
        with tarfile.open(archive, "r:gz") as source:
            members = source.getmembers()
            total = sum(member.size for member in members if member.isfile())
            if total > max_bytes:
                raise ArchiveTooLargeError(
                    f"the environment's archive holds {total} bytes, more than "
                    f"ACE3_ENV_MAX_BYTES ({max_bytes})"
                )
            source.extractall(into, members=members, filter="data")
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise BrokenArchiveError(f"the environment's archive is broken: {exc}") from exc
    return total
