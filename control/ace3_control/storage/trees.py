"""What a stored tree (an extracted archive: a directory of regular files) holds, as one sha256,
the same whichever backend stores it: the local store keeps a directory, the S3 store one tar
object. The API records the digest of the tree it stores (``tree_sha256`` of the model or
dataset); a fetch checks the tree it wrote against it, so bytes changed in the store, a file
added or removed, or a link slipped into the tar never reach a job."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from ace3.files import sha256_file
from ace3_control.storage.base import StoredDigestError


def _entries(root: Path) -> Iterator[str]:
    """One line per entry under ``root``: ``d <path>`` for a directory, ``f <path> <size>
    <sha256>`` for a regular file, ``l <path> <target>`` for a link (never followed) and
    ``o <path>`` for anything else; paths relative, as JSON strings."""
    for directory, subdirectories, names in os.walk(root):
        for name in (*subdirectories, *names):
            path = Path(directory) / name
            relative = json.dumps(path.relative_to(root).as_posix())
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                yield f"l {relative} {json.dumps(os.readlink(path))}"
            elif stat.S_ISDIR(mode):
                yield f"d {relative}"
            elif stat.S_ISREG(mode):
                yield f"f {relative} {path.lstat().st_size} {sha256_file(path)}"
            else:
                yield f"o {relative}"


def tree_digest(root: Path) -> str:
    """The sha256 of the tree under ``root``: of its entries' lines, sorted (file modes and
    times are not part of it; both stores keep them their own way)."""
    digest = hashlib.sha256()
    for line in sorted(_entries(root)):
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


def verify_tree(target: Path, sha256: str | None, key: str) -> None:
    """Check the tree just fetched into ``target`` from ``key`` against its recorded digest;
    on a mismatch the tree is removed and :class:`StoredDigestError` raised, naming the key.
    None: a tree stored before digests were recorded, taken as it is."""
    if sha256 is None:
        return
    found = tree_digest(target)
    if found != sha256.lower():
        shutil.rmtree(target, ignore_errors=True)
        raise StoredDigestError(
            f"stored tree {key} does not match its recorded digest {sha256[:12]} "
            f"(its files hash to {found[:12]})"
        )
