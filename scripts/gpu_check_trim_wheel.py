"""Rewrite a wheel in place without the native libraries the GPU machine cannot use
(scripts/gpu-check.sh --prepare): bitsandbytes ships one library per CUDA and ROCm release, about
40 MB in all, where the machine's torch loads one; the device tool carries 64 MiB at most.

Every member of the wheel whose path matches one of KEEP's globs, or is not a shared library
(``.so``), is kept; the others are dropped, and so are their lines of ``RECORD`` (whose hashes
pip checks against the files present).

Usage: python scripts/gpu_check_trim_wheel.py WHEEL KEEP_GLOB...
"""

from __future__ import annotations

import fnmatch
import os
import sys
import zipfile
from pathlib import Path


def keeps(name: str, patterns: list[str]) -> bool:
    return not name.endswith(".so") or any(fnmatch.fnmatch(name, p) for p in patterns)


def trim(wheel: Path, patterns: list[str]) -> list[str]:
    """Rewrite ``wheel`` without the shared libraries ``patterns`` do not name; return the
    dropped member names."""
    trimmed = wheel.with_suffix(".trimmed")
    dropped: list[str] = []
    with (
        zipfile.ZipFile(wheel) as source,
        zipfile.ZipFile(trimmed, "w", compression=zipfile.ZIP_DEFLATED) as target,
    ):
        names = [info.filename for info in source.infolist()]
        dropped = [name for name in names if not keeps(name, patterns)]
        for info in source.infolist():
            if info.filename in dropped:
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                kept = [line for line in lines if line.split(",", 1)[0] not in dropped]
                data = ("\n".join(kept) + "\n").encode()
            target.writestr(info, data)
    os.replace(trimmed, wheel)
    return dropped


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    wheel = Path(argv[1])
    before = wheel.stat().st_size
    dropped = trim(wheel, argv[2:])
    print(
        f"gpu-check: {wheel.name}: {len(dropped)} libraries dropped, "
        f"{before >> 20} MiB -> {wheel.stat().st_size >> 20} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
