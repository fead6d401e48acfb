"""An environment as the artifact store holds it: one ``tar.gz`` of its tree under
``environments/<hash>.tar.gz``, its sha256 recorded in the environments row and checked by
every worker that fetches it. Unpacking uses tarfile's ``data`` filter (no absolute paths, no
``..``, no link leading out of the tree, no device files) and refuses an archive whose members
add up to more than ``ACE3_ENV_MAX_BYTES``."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from ace3.files import sha256_file


def storage_key(environment_hash: str) -> str:
    """Where the store keeps an environment's archive."""
    return f"environments/{environment_hash}.tar.gz"


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
    """Extract ``archive`` into the new directory ``into``; the bytes its files hold."""
    into.mkdir(mode=0o700)
    with tarfile.open(archive, "r:gz") as source:
        members = source.getmembers()
        total = sum(member.size for member in members if member.isfile())
        if total > max_bytes:
            raise ValueError(
                f"the environment's archive holds {total} bytes, more than ACE3_ENV_MAX_BYTES "
                f"({max_bytes})"
            )
        source.extractall(into, members=members, filter="data")
    return total
