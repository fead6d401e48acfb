"""Pack a directory into a deterministic ``.tar.gz`` for upload.

The same directory contents always give the same archive bytes (entries sorted, mtimes,
owners and the gzip timestamp zeroed, modes normalised), so its sha256 identifies the content
and an unchanged model or dataset is not uploaded twice. Links and special files are refused:
the server would refuse them anyway, and following them could pack files from outside the
directory. A Hugging Face model directory is the exception (:func:`pack_hf_model`):
the hub's cache links each file into ``../../blobs/``, so its links to files are packed as the
files they point to.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, Final

from ace3.errors import PackingError

# Never packed: caches and version-control folders (they change without the code changing).
EXCLUDED_NAMES = frozenset({"__pycache__", ".git", ".hg", ".svn", ".DS_Store"})
EXCLUDED_SUFFIXES = (".pyc", ".pyo")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
HUGGINGFACE: Final = "huggingface"  # the model kind of a Hugging Face model directory
HF_CONFIG = "config.json"  # what marks one (at its top)
HF_FACTORY = "from_pretrained"  # the factory its record names
HF_SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
# Pickled weights (and the original/ folder of Meta's .pth checkpoints): the server never loads
# them next to safetensors weights, and they would double the upload.
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HF_ORIGINAL = "original"
# safetensors weights barely compress: level 1 packs GBs several times faster than gzip's 9.
HF_COMPRESSLEVEL = 1


def _is_excluded(name: str) -> bool:
    return name in EXCLUDED_NAMES or name.endswith(EXCLUDED_SUFFIXES)


def iter_directory(
    directory: Path, *, follow_file_links: bool = False
) -> Iterator[tuple[Path, str, bool]]:
    """``(path, archive-relative name, is_dir)`` for everything to pack, sorted, depth first.

    Raises :class:`PackingError` at the first symlink (unless ``follow_file_links``, where a
    link to a regular file is packed as that file, under the link's name) or special file.
    """

    def walk(current: Path, relative: str) -> Iterator[tuple[Path, str, bool]]:
        with os.scandir(current) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
        for entry in entries:
            if _is_excluded(entry.name):
                continue
            path = Path(entry.path)
            name = f"{relative}/{entry.name}" if relative else entry.name
            if entry.is_symlink() and follow_file_links:
                yield _file_link(path), name, False
                continue
            if entry.is_symlink():
                raise PackingError(
                    f"cannot pack {path}: it is a symbolic link. Links are refused (they could "
                    "point outside the directory); replace it with a copy of its target"
                )
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                yield path, name, True
                yield from walk(path, name)
            elif stat.S_ISREG(mode):
                yield path, name, False
            else:
                raise PackingError(
                    f"cannot pack {path}: only regular files and directories can be packed"
                )

    yield from walk(directory, "")


def _file_link(link: Path) -> Path:
    """``link`` when it points (through any links) to a regular file; PackingError otherwise."""
    try:
        mode = link.stat().st_mode
    except OSError:
        raise PackingError(
            f"cannot pack {link}: it is a symbolic link to {os.readlink(link)!r}, which does not "
            "exist (a hub cache download cut short?)"
        ) from None
    if not stat.S_ISREG(mode):
        raise PackingError(
            f"cannot pack {link}: it is a symbolic link to {os.readlink(link)!r}, which is not a "
            "regular file; only links to files are followed: replace it with a copy"
        )
    return link


def _tar_info(
    name: str, *, is_dir: bool, size: int = 0, executable: bool = False
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if is_dir:
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    else:
        info.type = tarfile.REGTYPE
        info.size = size
        info.mode = 0o755 if executable else 0o644
    return info


def pack_directory(
    directory: str | os.PathLike[str],
    destination: str | os.PathLike[str] | BinaryIO,
    *,
    prefix: str | None = None,
) -> list[str]:
    """Write ``directory`` as a deterministic gzip-compressed tar to ``destination`` (a path or
    a binary file object) and return the member names, in archive order.

    Members are named relative to ``directory``, under ``prefix/`` when a prefix is given
    (use the directory's own name to keep a package importable as itself).
    """
    root = Path(directory)
    if not root.is_dir():
        raise NotADirectoryError(f"not a directory: {root}")
    entries = list(iter_directory(root))  # refuse links before writing anything
    return _write_archive(entries, destination, prefix=prefix)


def pack_hf_model(
    directory: str | os.PathLike[str], destination: str | os.PathLike[str] | BinaryIO
) -> list[str]:
    """Write the Hugging Face model ``directory`` as :func:`pack_directory` would, but with
    links to files packed as those files (a hub cache snapshot), pickled weight files and an
    ``original/`` folder holding them left out (with a warning) where safetensors weights are
    there, and gzip level 1; the member names, in archive order."""
    root = Path(directory)
    if not root.is_dir():
        raise NotADirectoryError(f"not a directory: {root}")
    entries = list(iter_directory(root, follow_file_links=True))
    if any((root / name).is_file() for name in HF_SAFETENSORS):
        entries = _without_pickled_weights(root, entries)
    return _write_archive(entries, destination, compresslevel=HF_COMPRESSLEVEL)


def _without_pickled_weights(
    root: Path, entries: list[tuple[Path, str, bool]]
) -> list[tuple[Path, str, bool]]:
    """``entries`` less pickled files and, where it holds some, all of ``original/``; a
    warning naming what is left out, if anything."""
    pickled = {
        name for _, name, is_dir in entries if name.endswith(PICKLED_SUFFIXES) and not is_dir
    }
    original = f"{HF_ORIGINAL}/"
    skip_original = any(name.startswith(original) for name in pickled)

    def left_out(name: str) -> bool:
        in_original = name == HF_ORIGINAL or name.startswith(original)
        return name in pickled or (skip_original and in_original)

    if pickled:
        shown = ", ".join(sorted(pickled)[:3]) + (", ..." if len(pickled) > 3 else "")
        warnings.warn(
            f"{root}: not packing {len(pickled)} pickled weight file(s) ({shown})"
            + (f" nor the rest of {original}" if skip_original else "")
            + ": the server loads only the safetensors weights next to them",
            stacklevel=4,
        )
    return [entry for entry in entries if not left_out(entry[1])]


def _write_archive(
    entries: Sequence[tuple[Path, str, bool]],
    destination: str | os.PathLike[str] | BinaryIO,
    *,
    prefix: str | None = None,
    compresslevel: int = 9,
) -> list[str]:
    prefix = (prefix or "").strip("/")
    members: list[str] = []

    def write(raw: BinaryIO) -> None:
        with (
            gzip.GzipFile(
                filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=compresslevel
            ) as compressed,
            tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive,
        ):
            if prefix:
                archive.addfile(_tar_info(prefix, is_dir=True))
                members.append(prefix)
            for path, name, is_dir in entries:
                member = f"{prefix}/{name}" if prefix else name
                if is_dir:
                    archive.addfile(_tar_info(member, is_dir=True))
                else:
                    status = path.stat()
                    info = _tar_info(
                        member,
                        is_dir=False,
                        size=status.st_size,
                        executable=bool(status.st_mode & stat.S_IXUSR),
                    )
                    with open(path, "rb") as handle:
                        archive.addfile(info, handle)
                members.append(member)

    if isinstance(destination, str | os.PathLike):
        with open(destination, "wb") as raw:
            write(raw)
    else:
        write(destination)
    return members


def pack_directory_bytes(directory: str | os.PathLike[str], *, prefix: str | None = None) -> bytes:
    """The archive :func:`pack_directory` writes, in memory (for small directories and tests)."""
    buffer = io.BytesIO()
    pack_directory(directory, buffer, prefix=prefix)
    return buffer.getvalue()


def archive_has_top_level_file(archive: str | os.PathLike[str], name: str) -> bool:
    """Whether the ``.tar.gz``/``.tgz``/``.tar``/``.zip`` ``archive`` holds the file ``name``
    at its top (``name`` or ``./name``); False for an archive that cannot be read (the server
    says what is wrong with it)."""
    wanted = {name, f"./{name}"}
    try:
        if str(archive).lower().endswith(".zip"):
            with zipfile.ZipFile(archive) as packed:
                return any(member in wanted for member in packed.namelist())
        with tarfile.open(archive) as packed:  # (stops at the first match: no full read)
            return any(member.name in wanted and member.isfile() for member in packed)
    except (OSError, tarfile.TarError, zipfile.BadZipFile):
        return False


def is_hf_model(source: Path) -> bool:
    """Whether ``source`` is a Hugging Face model directory (a ``config.json`` at its top, as
    ``save_pretrained`` writes) or an archive of one."""
    if source.is_dir():
        return (source / HF_CONFIG).is_file()
    return source.name.lower().endswith(ARCHIVE_SUFFIXES) and archive_has_top_level_file(
        source, HF_CONFIG
    )
