"""Safe extraction refuses path escapes, links, devices and archive bombs before writing anything."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from ace3_server import archives
from ace3_server.archives import UnsafeArchiveError, safe_extract


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def test_regular_files_and_directories_are_extracted(tmp_path: Path) -> None:
    archive = _tar(
        tmp_path / "ok.tar.gz", [_file("pkg/__init__.py", b""), _file("pkg/model.py", b"x = 1\n")]
    )
    dest = tmp_path / "out"
    total = safe_extract(archive, dest, filename="ok.tar.gz", max_total_bytes=1000)
    assert (dest / "pkg" / "model.py").read_bytes() == b"x = 1\n"
    assert total == 6


@pytest.mark.parametrize("name", ["../escape.py", "/etc/evil.py", "pkg/../../escape.py"])
def test_path_escapes_are_refused(tmp_path: Path, name: str) -> None:
    archive = _tar(tmp_path / "bad.tar.gz", [_file(name, b"boom")])
    with pytest.raises(UnsafeArchiveError, match="not allowed"):
        safe_extract(archive, tmp_path / "out", filename="bad.tar.gz", max_total_bytes=1000)
    assert not (tmp_path / "escape.py").exists()
    assert not any((tmp_path / "out").rglob("*"))


@pytest.mark.parametrize(
    "kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE]
)
def test_links_and_devices_are_refused(tmp_path: Path, kind: bytes) -> None:
    info = tarfile.TarInfo("pkg/link")
    info.type = kind
    info.linkname = "/etc/passwd"
    archive = _tar(tmp_path / "links.tar.gz", [_file("pkg/a.py", b"a"), (info, None)])
    with pytest.raises(UnsafeArchiveError, match="no links or devices"):
        safe_extract(archive, tmp_path / "out", filename="links.tar.gz", max_total_bytes=1000)
    assert not (tmp_path / "out" / "pkg" / "a.py").exists(), (
        "nothing is written before every member is checked"
    )


def test_archive_bombs_are_refused_by_their_declared_size(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "big.tar.gz", [_file("a.bin", b"\0" * 5000)])
    with pytest.raises(UnsafeArchiveError, match="more than 1000 bytes"):
        safe_extract(archive, tmp_path / "out", filename="big.tar.gz", max_total_bytes=1000)


def test_zip_escapes_and_symlinks_are_refused(tmp_path: Path) -> None:
    escape = tmp_path / "escape.zip"
    with zipfile.ZipFile(escape, "w") as zipped:
        zipped.writestr("../x.py", "boom")
    with pytest.raises(UnsafeArchiveError, match=r"'\.\.'"):
        safe_extract(escape, tmp_path / "out", filename="escape.zip", max_total_bytes=1000)

    link = tmp_path / "link.zip"
    with zipfile.ZipFile(link, "w") as zipped:
        info = zipfile.ZipInfo("pkg/link")
        info.external_attr = 0o120777 << 16
        zipped.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchiveError, match="no links"):
        safe_extract(link, tmp_path / "out2", filename="link.zip", max_total_bytes=1000)


def test_garbage_is_refused_as_unreadable(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive at all")
    with pytest.raises(UnsafeArchiveError, match="not a readable tar"):
        safe_extract(junk, tmp_path / "out", filename="junk.tar.gz", max_total_bytes=1000)


def test_zips_written_by_python_writestr_are_accepted(tmp_path: Path) -> None:
    """zipfile.writestr(name, data) leaves the member's file-type bits empty (mode 0o600)."""
    archive = tmp_path / "pkg.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("pkg/__init__.py", "")
        zipped.writestr("pkg/model.py", "x = 1\n")
    dest = tmp_path / "out"
    assert safe_extract(archive, dest, filename="pkg.zip", max_total_bytes=1000) == 6
    assert (dest / "pkg" / "model.py").read_text() == "x = 1\n"


@pytest.mark.parametrize("suffix", [".tar.gz", ".zip"])
def test_archives_with_too_many_members_are_refused(tmp_path: Path, suffix: str) -> None:
    archive = tmp_path / f"many{suffix}"
    if suffix == ".zip":
        with zipfile.ZipFile(archive, "w") as zipped:
            for index in range(11):
                zipped.writestr(f"f{index}.py", "")
    else:
        _tar(archive, [_file(f"f{index}.py", b"") for index in range(11)])
    dest = tmp_path / "out"
    with pytest.raises(UnsafeArchiveError, match="more than 10 members"):
        safe_extract(archive, dest, filename=archive.name, max_total_bytes=1000, max_members=10)
    assert not any(dest.rglob("*")), "a refused archive leaves nothing behind"


def test_compression_bombs_stop_while_decompressing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member within the size budget, but compressed far past any honest ratio: extraction
    stops after ratio x upload size, without decompressing the rest."""
    monkeypatch.setattr(archives, "RATIO_FLOOR_BYTES", 1 << 20)
    archive = tmp_path / "bomb.tar.gz"
    info = tarfile.TarInfo("zeros.bin")
    info.size = 32 << 20
    with tarfile.open(archive, "w:gz") as tar:
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    assert archive.stat().st_size * archives.MAX_COMPRESSION_RATIO < info.size
    dest = tmp_path / "out"
    with pytest.raises(UnsafeArchiveError, match="compression bomb"):
        safe_extract(archive, dest, filename="bomb.tar.gz", max_total_bytes=1 << 30)
    assert not any(dest.rglob("*"))


def test_oversized_tar_metadata_records_are_refused(tmp_path: Path) -> None:
    """tarfile reads a pax header whole into memory: one of gigabytes would be read at once."""
    archive = tmp_path / "pax.tar.gz"
    data = b"x = 1\n"
    info = tarfile.TarInfo("model.py")
    info.size = len(data)
    info.pax_headers = {"comment": "x" * (archives.MAX_TAR_HEADER_BYTES + 1)}
    with tarfile.open(archive, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(UnsafeArchiveError, match="metadata record"):
        safe_extract(archive, tmp_path / "out", filename="pax.tar.gz", max_total_bytes=1000)


def test_a_member_colliding_with_another_is_refused(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "clash.tar.gz", [_file("pkg", b"a file"), _file("pkg/a.py", b"")])
    with pytest.raises(UnsafeArchiveError, match="collides"):
        safe_extract(archive, tmp_path / "out", filename="clash.tar.gz", max_total_bytes=1000)
