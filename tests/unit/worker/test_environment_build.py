"""Building an environment with uv from a wheelhouse the test writes (no network), as the worker
itself (no sandbox: the sandboxed build runs in tests/integration/worker/test_environments.py):
what a build adds, read-only; a missing package and another torch refused with the resolver's
own explanation; the time and size limits, each named; what uv is told and not told."""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from ace3_control.installed_packages import installed_packages
from ace3_control.settings import Settings
from ace3_worker.environments.build import EnvironmentBuilder
from ace3_worker.environments.identity import environment_identity
from ace3_worker.environments.uv_commands import (
    EnvironmentRefusedError,
    parse_resolution,
    resolve_argv,
    uv_environment,
)
from ace3_worker.sandbox.plan import SandboxPlan
from tests.wheelhouse import make_wheel

PLAN = SandboxPlan(mode="none", dedicated_uids=False, runtime_paths=(), hidden=())


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    root = tmp_path / "wheelhouse"
    make_wheel(root, "tinyext", "1.0", {"tinyext/__init__.py": "VALUE = 42\n"}, ["tinydep>=0.1"])
    make_wheel(root, "tinydep", "0.2", {"tinydep/__init__.py": "X = 1\n"})
    make_wheel(root, "bigpkg", "1.0", {"bigpkg/__init__.py": "#" * 50_000 + "\n"})
    return root


def _builder(tmp_path: Path, wheelhouse: Path, **changes: Any) -> EnvironmentBuilder:
    settings = Settings(
        data_dir=tmp_path / "data", pip_find_links=str(wheelhouse), pip_offline=True, **changes
    )
    return EnvironmentBuilder(settings, PLAN, log=lambda text: None)


def _scratch(tmp_path: Path, name: str = "scratch") -> Path:
    scratch = tmp_path / name
    scratch.mkdir()
    return scratch


def test_a_build_adds_the_package_and_its_dependency_read_only(
    tmp_path: Path, wheelhouse: Path
) -> None:
    lines: list[str] = []
    builder = _builder(tmp_path, wheelhouse)
    builder.log = lines.append
    built = builder.build(["tinyext"], _scratch(tmp_path))
    assert [pin.requirement for pin in built.pins] == ["tinydep==0.2", "tinyext==1.0"]
    assert (built.path / "tinyext" / "__init__.py").read_text() == "VALUE = 42\n"
    assert not (built.path / ".lock").exists()
    assert (built.path / "tinyext" / "__init__.py").stat().st_mode & 0o777 == 0o444
    assert built.path.stat().st_mode & 0o777 == 0o555
    assert built.size_bytes > 0
    assert any(line.startswith("uv: ") and "tinyext==1.0" in line for line in lines), lines


def test_a_package_the_wheelhouse_lacks_is_refused_with_the_resolvers_message(
    tmp_path: Path, wheelhouse: Path
) -> None:
    with pytest.raises(EnvironmentRefusedError) as refused:
        _builder(tmp_path, wheelhouse).build(["missingpkg"], _scratch(tmp_path))
    assert "Because missingpkg was not found in the provided package locations" in str(
        refused.value
    )


def test_another_torch_is_refused_never_installed(tmp_path: Path, wheelhouse: Path) -> None:
    torch = installed_packages()["torch"]
    with pytest.raises(EnvironmentRefusedError) as refused:
        _builder(tmp_path, wheelhouse).build(["torch==2.0.0"], _scratch(tmp_path))
    assert f"Because you require torch==2.0.0 and torch=={torch}" in str(refused.value)


def test_the_time_limit_stops_the_build_naming_the_setting(
    tmp_path: Path, wheelhouse: Path
) -> None:
    builder = _builder(tmp_path, wheelhouse, env_build_timeout_seconds=0.001)
    with pytest.raises(EnvironmentRefusedError, match="ACE3_ENV_BUILD_TIMEOUT_SECONDS"):
        builder.build(["tinyext"], _scratch(tmp_path))


def test_the_size_limit_refuses_a_larger_environment_naming_the_setting(
    tmp_path: Path, wheelhouse: Path
) -> None:
    builder = _builder(tmp_path, wheelhouse, env_max_bytes=10_000)
    with pytest.raises(EnvironmentRefusedError, match="larger than ACE3_ENV_MAX_BYTES"):
        builder.build(["bigpkg"], _scratch(tmp_path))


def test_only_additions_are_accepted_from_the_resolution() -> None:
    added = '{"changes": [{"name": "b", "version": "2", "action": "installed"}, '
    added += '{"name": "a", "version": "1", "action": "installed"}], "dry_run": true}'
    assert [pin.requirement for pin in parse_resolution(added)] == ["a==1", "b==2"]
    replaced = '{"changes": [{"name": "numpy", "version": "1.0", "action": "reinstalled"}]}'
    with pytest.raises(EnvironmentRefusedError, match=r"numpy 1\.0 would change the worker's own"):
        parse_resolution(replaced)


def test_index_credentials_reach_uv_by_its_environment_alone(tmp_path: Path) -> None:
    secret = "https://user:s3cret@pypi.example/simple"
    settings = Settings(data_dir=tmp_path, pip_index_url=secret, pip_extra_index_url=secret)
    env = uv_environment(settings, home=PurePosixPath("/h"), cache=PurePosixPath("/c"))
    assert env["UV_INDEX_URL"] == secret and env["UV_NO_CONFIG"] == "1"
    assert not [key for key in env if key.startswith(("ACE3_", "AWS_"))]
    argv = resolve_argv("uv", sys.executable, PurePosixPath("/c.txt"), ["a"], settings)
    assert not any("s3cret" in part for part in argv) and "--no-build" in argv


def test_the_identity_ignores_spelling_and_follows_the_installation() -> None:
    installed = {"torch": "2.13.0+cpu", "numpy": "2.0"}
    one = environment_identity(["Tiny_Ext>=1", "einops"], installed=installed)
    same = environment_identity(["einops", "tiny-ext >= 1"], installed=installed)
    assert one.hash == same.hash and one.requirements == ("einops", "tiny-ext>=1")
    other_torch = environment_identity(
        ["einops", "tiny-ext>=1"], installed={**installed, "torch": "2.13.0+cu128"}
    )
    other_python = environment_identity(["einops"], installed=installed, python="cpython-3.12")
    assert len({one.hash, other_torch.hash, other_python.hash}) == 3


def test_an_interrupt_kills_uv_at_once(
    tmp_path: Path, wheelhouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job was cancelled while its environment was built: uv (here a stand-in that would
    take a minute) is killed within a poll, and the build raises PreparationInterrupted."""
    import threading
    import time

    from ace3_worker.environments import build as build_module
    from ace3_worker.environments.uv_commands import PreparationInterrupted

    slow = tmp_path / "slow-uv"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(0o755)
    monkeypatch.setattr(build_module, "find_uv", lambda: str(slow))
    builder = _builder(tmp_path, wheelhouse)
    threading.Timer(0.3, builder.interrupt.set).start()
    started = time.monotonic()
    with pytest.raises(PreparationInterrupted):
        builder.build(["tinyext"], _scratch(tmp_path))
    assert time.monotonic() - started < 5


def _wheel_with_modes(
    root: Path, name: str, files: dict[str, tuple[bytes, int]], extra: dict[str, str] | None = None
) -> Path:
    """A wheel whose members carry Unix modes (``make_wheel`` writes none)."""
    import base64
    import hashlib
    import zipfile

    dist = f"{name}-1.0"
    members = {path: (data, mode) for path, (data, mode) in files.items()}
    metadata = {
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
        **(extra or {}),
    }
    members.update({path: (text.encode(), 0o644) for path, text in metadata.items()})
    record = [
        f"{path},sha256="
        f"{base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
        f"{len(data)}"
        for path, (data, _) in members.items()
    ]
    members[f"{dist}.dist-info/RECORD"] = (
        "\n".join([*record, f"{dist}.dist-info/RECORD,,"]).encode() + b"\n",
        0o644,
    )
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, (data, mode) in members.items():
            info = zipfile.ZipInfo(member)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return path


def test_exec_bits_survive_as_0555_and_setuid_never(tmp_path: Path, wheelhouse: Path) -> None:
    """A bundled binary and a console script stay executable (read-only); setuid is dropped."""
    _wheel_with_modes(
        wheelhouse, "tooled",
        {"tooled/__init__.py": (b"def main(): pass\n", 0o644),
         "tooled/bin/ninja": (b"#!/bin/sh\necho ninja\n", 0o755),
         "tooled/bin/suid": (b"#!/bin/sh\n", 0o4755)},
        {"tooled-1.0.dist-info/entry_points.txt": "[console_scripts]\ntooled = tooled:main\n"},
    )  # fmt: skip
    built = _builder(tmp_path, wheelhouse).build(["tooled"], _scratch(tmp_path))
    mode = {
        name: (built.path / name).stat().st_mode & 0o7777
        for name in ("tooled/__init__.py", "tooled/bin/ninja", "tooled/bin/suid", "bin/tooled")
    }
    assert mode == {"tooled/__init__.py": 0o444, "tooled/bin/ninja": 0o555,
                    "tooled/bin/suid": 0o555, "bin/tooled": 0o555}  # fmt: skip


def test_a_file_past_the_size_limit_is_never_written_whole(
    tmp_path: Path, wheelhouse: Path
) -> None:
    """A small wheel of zeros that unpacks past ACE3_ENV_MAX_BYTES: uv is stopped by
    RLIMIT_FSIZE while it unpacks into its cache, before the file is whole (the cache is
    where the whole file used to land, unmeasured)."""
    _wheel_with_modes(wheelhouse, "zeros", {"zeros/blob.bin": (b"\0" * (8 << 20), 0o644)})
    limit = 1 << 20
    scratch = _scratch(tmp_path)
    with pytest.raises(EnvironmentRefusedError, match=r"ACE3_ENV_MAX_BYTES \(1048576 bytes\)"):
        _builder(tmp_path, wheelhouse, env_max_bytes=limit).build(["zeros"], scratch)
    sizes = [path.lstat().st_size for path in (scratch / "work").rglob("*")]
    assert sizes and max(sizes) <= limit


def test_the_resolution_is_watched_too(
    tmp_path: Path, wheelhouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dry run downloads wheels into uv's cache: a stand-in uv filling it (files each under
    the limit) is killed within a poll, naming ACE3_ENV_MAX_BYTES, long before the timeout."""
    import time

    from ace3_worker.environments import build as build_module

    filler = tmp_path / "filling-uv"
    filler.write_text(
        '#!/bin/sh\nfor i in 1 2 3 4 5 6 7 8; do head -c 1000000 /dev/zero > "$UV_CACHE_DIR/w$i"'
        "; done\nexec sleep 60\n"
    )
    filler.chmod(0o755)
    monkeypatch.setattr(build_module, "find_uv", lambda: str(filler))
    builder = _builder(tmp_path, wheelhouse, env_max_bytes=1_500_000, env_build_timeout_seconds=20)
    started = time.monotonic()
    with pytest.raises(EnvironmentRefusedError, match=r"ACE3_ENV_MAX_BYTES.*uv's cache"):
        builder.build(["tinyext"], _scratch(tmp_path))
    assert time.monotonic() - started < 10


def test_more_files_than_max_files_are_refused(
    tmp_path: Path, wheelhouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ace3_worker.environments import build_limits

    monkeypatch.setattr(build_limits, "MAX_FILES", 20)
    make_wheel(wheelhouse, "manyfiles", "1.0", {f"manyfiles/m{i}.txt": "" for i in range(40)})
    with pytest.raises(EnvironmentRefusedError, match=r"more than 20 files.*MAX_FILES"):
        _builder(tmp_path, wheelhouse).build(["manyfiles"], _scratch(tmp_path))


def test_uv_failures_that_may_pass_are_build_errors(
    tmp_path: Path, wheelhouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real uv: an index nothing listens on, a wheelhouse that vanished, uv killed by a
    signal: EnvironmentBuildError (retried); a malformed wheel: refused for good."""
    import socket

    from ace3_worker.environments import build as build_module
    from ace3_worker.environments.uv_commands import EnvironmentBuildError, uv_environment

    monkeypatch.setattr(
        build_module, "uv_environment",
        lambda *a, **k: {**uv_environment(*a, **k), "UV_HTTP_RETRIES": "0"},
    )  # fmt: skip
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    settings = Settings(data_dir=tmp_path / "data", pip_index_url=f"http://127.0.0.1:{port}/simple")
    with pytest.raises(EnvironmentBuildError, match="Connection refused"):
        EnvironmentBuilder(settings, PLAN).build(["tinyext"], _scratch(tmp_path))
    gone = _builder(tmp_path, tmp_path / "gone")
    with pytest.raises(EnvironmentBuildError, match="find-links"):
        gone.build(["tinyext"], _scratch(tmp_path, "s2"))
    (wheelhouse / "broken-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04" + b"junk" * 50)
    with pytest.raises(EnvironmentRefusedError, match="invalid"):
        _builder(tmp_path, wheelhouse).build(["broken"], _scratch(tmp_path, "s3"))
    killer = tmp_path / "killed-uv"
    killer.write_text("#!/bin/sh\nkill -TERM $$\n")
    killer.chmod(0o755)
    monkeypatch.setattr(build_module, "find_uv", lambda: str(killer))
    with pytest.raises(EnvironmentBuildError, match="SIGTERM"):
        _builder(tmp_path, wheelhouse).build(["tinyext"], _scratch(tmp_path, "s4"))


def test_no_source_build_as_the_build_uid_without_bubblewrap(tmp_path: Path) -> None:
    """ACE3_SANDBOX=uid: a package's build code would run as the build uid with no namespace
    to end it (a setsid child outlives any process group): uv gets --no-build anyway."""
    import os

    settings = Settings(data_dir=tmp_path, pip_allow_source_builds=True)
    uid_plan = SandboxPlan(mode="uid", dedicated_uids=True, runtime_paths=(), hidden=())
    builder = EnvironmentBuilder(settings, uid_plan)
    lines: list[str] = []
    builder.log = lines.append
    follows = builder._uv_settings()
    if os.geteuid() == 0:
        assert not follows.pip_allow_source_builds and "ACE3_PIP_ALLOW_SOURCE_BUILDS" in lines[0]
    bwrap_plan = SandboxPlan(mode="bwrap", dedicated_uids=True, runtime_paths=(), hidden=())
    assert EnvironmentBuilder(settings, bwrap_plan)._uv_settings().pip_allow_source_builds


def test_uvs_output_is_read_a_bounded_piece_at_a_time(
    tmp_path: Path, wheelhouse: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line without end on uv's stderr (a build backend uv relays could write one) reaches
    the job's log, and the worker's memory, in pieces of at most MAX_LINE_CHARS."""
    from ace3_worker.environments import build as build_module
    from ace3_worker.environments.uv_commands import EnvironmentBuildError
    from ace3_worker.reports import MAX_LINE_CHARS

    chatty = tmp_path / "chatty-uv"
    chatty.write_text("#!/bin/sh\nhead -c 200000 /dev/zero | tr '\\0' x >&2\nexit 1\n")
    chatty.chmod(0o755)
    monkeypatch.setattr(build_module, "find_uv", lambda: str(chatty))
    lines: list[str] = []
    builder = _builder(tmp_path, wheelhouse)
    builder.log = lines.append
    with pytest.raises((EnvironmentRefusedError, EnvironmentBuildError)):
        builder.build(["tinyext"], _scratch(tmp_path))
    pieces = [line for line in lines if line.startswith("uv: x")]
    assert len(pieces) >= 200000 // MAX_LINE_CHARS
    assert max(len(line) for line in pieces) <= len("uv: ") + MAX_LINE_CHARS
