"""Wheels written by the tests themselves, for environments built with no network: a wheel is a
zip of the package's files plus its ``.dist-info`` (METADATA, WHEEL, RECORD), which is all
``uv`` and ``pip`` need to resolve and install it (PEP 427)."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    wheelhouse: Path,
    name: str,
    version: str,
    files: Mapping[str, str | bytes],
    requires: Iterable[str] = (),
) -> Path:
    """``<wheelhouse>/<name>-<version>-py3-none-any.whl`` holding ``files`` (paths relative to
    site-packages: ``{"tinyext/__init__.py": "VALUE = 42\\n"}``), depending on ``requires``."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}"
    contents: dict[str, bytes] = {
        path: data.encode() if isinstance(data, str) else data for path, data in files.items()
    }
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    contents[f"{dist}.dist-info/METADATA"] = metadata.encode()
    contents[f"{dist}.dist-info/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: ace3-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in contents.items()]
    record.append(f"{dist}.dist-info/RECORD,,")
    contents[f"{dist}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    path = wheelhouse / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in contents.items():
            archive.writestr(member, data)
    return path
