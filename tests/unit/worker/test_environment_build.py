"""Building an environment with uv from a wheelhouse the test writes (no network), as the worker
itself (no sandbox: the sandboxed build runs in tests/integration/worker/test_environments.py):
what a build adds, read-only; a missing package and another torch refused with the resolver's
own explanation; the time and size limits, each named; what uv is told and not told."""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath

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


def _builder(tmp_path: Path, wheelhouse: Path, **changes: object) -> EnvironmentBuilder:
    settings = Settings(
        data_dir=tmp_path / "data", pip_find_links=str(wheelhouse), pip_offline=True, **changes
    )
    return EnvironmentBuilder(settings, PLAN, log=lambda text: None)


def _scratch(tmp_path: Path) -> Path:
    scratch = tmp_path / "scratch"
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
