"""scripts/gpu-check.sh and its helpers, on a machine without a GPU: every ``gpu`` test is
collected and skipped with the reason "no CUDA device" (and every test of tests/gpu is one), the
dry run installs and runs nothing, the time bound ends checks that outlast it, bad arguments are
refused; the JUnit summary names each check's outcome and the wheel trimmer drops only the
native libraries it is not told to keep."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"

needs_no_gpu = pytest.mark.skipif(
    torch.cuda.is_available(), reason="a CUDA device is here: the script would run the checks"
)


def _script_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpu_check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**os.environ, "GPU_CHECK_PYTHON": sys.executable, **env},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
@needs_no_gpu
def test_without_cuda_every_gpu_test_is_collected_and_skipped_with_the_reason(
    tmp_path: Path,
) -> None:
    done = gpu_check(OUT=str(tmp_path))
    assert done.returncode == 3, done.stdout + done.stderr
    assert "no CUDA device: nothing installed" in done.stdout
    summary = (tmp_path / "gpu-check-summary.txt").read_text().splitlines()
    checks = [line.removeprefix("SKIPPED  ").removesuffix(": no CUDA device") for line in summary]
    assert all(line.startswith("SKIPPED  ") for line in summary[:-1]), summary
    assert all(line.endswith(": no CUDA device") for line in summary[:-1]), summary
    assert summary[-1] == f"gpu-check: 0 passed, 0 failed, {len(summary) - 1} skipped"
    # At least one check of each module ran into the skip (each path has its own module).
    modules = sorted(path.name for path in (ROOT / "tests" / "gpu").glob("test_*.py"))
    assert sorted({check.split("::")[0].rsplit("/", 1)[-1] for check in checks[:-1]}) == modules
    assert len(summary) - 1 >= 10
    assert (tmp_path / "gpu-check-junit.xml").is_file() and (tmp_path / "gpu-check.log").is_file()


def test_every_test_of_tests_gpu_is_marked_gpu() -> None:
    for path in (ROOT / "tests" / "gpu").glob("test_*.py"):
        assert "\npytestmark = pytest.mark.gpu\n" in path.read_text(), path.name


@pytest.mark.slow
def test_the_dry_run_installs_and_runs_nothing(tmp_path: Path) -> None:
    carry = tmp_path / "carry"
    (carry / "wheels").mkdir(parents=True)
    (carry / "wheels" / "not_a_real-1.0-py3-none-any.whl").write_bytes(b"")
    tests = tmp_path / "checks"
    tests.mkdir()
    (tests / "test_one.py").write_text(
        "import pytest\n\n\n@pytest.mark.gpu\ndef test_one() -> None:\n    raise AssertionError\n"
    )
    out = tmp_path / "out"
    done = gpu_check(
        "--dry-run", GPU_CHECK_CARRY=str(carry), GPU_CHECK_TESTS=str(tests), OUT=str(out)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "would install into " in done.stdout and "not_a_real-1.0-py3-none-any.whl" in done.stdout
    fate = "would run" if torch.cuda.is_available() else "skipped: no CUDA device"
    assert "test_one.py::test_one" in done.stdout and fate in done.stdout
    assert not out.exists(), "a dry run writes no log and runs no check"


@pytest.mark.slow
@needs_no_gpu
def test_the_time_bound_ends_checks_that_outlast_it(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text(
        "import time\n\nimport pytest\n\ntime.sleep(300)\n\n\n"
        "@pytest.mark.gpu\ndef test_never() -> None:\n    pass\n"
    )
    started = time.monotonic()
    done = gpu_check(
        GPU_CHECK_TESTS=str(tmp_path), GPU_CHECK_BUDGET_S="30", OUT=str(tmp_path / "out")
    )
    took = time.monotonic() - started
    assert done.returncode == 124, done.stdout + done.stderr
    assert "ran past their time bound" in done.stdout and "no JUnit report" in done.stdout
    assert took < 30 + 10, f"the 30 s bound took {took:.0f} s"


def test_bad_arguments_are_refused() -> None:
    done = gpu_check("--frobnicate")
    assert done.returncode == 2 and "unknown argument: --frobnicate" in done.stderr
    budget = gpu_check("--dry-run", GPU_CHECK_BUDGET_S="eight minutes")
    assert budget.returncode == 2 and "GPU_CHECK_BUDGET_S must be a number" in budget.stderr


def test_the_summary_names_each_outcome_and_counts_them(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.gpu.test_a" name="test_ok" />'
        '<testcase classname="tests.gpu.test_a" name="test_skip[x]">'
        '<skipped type="pytest.skip" message="no CUDA device">...</skipped></testcase>'
        '<testcase classname="tests.gpu.test_b" name="test_bad">'
        '<failure message="AssertionError: no CUDA graph was recorded&#10;assert 0 &gt;= 1">'
        "...</failure></testcase>"
        '<testcase classname="tests.gpu.test_b" name="test_setup">'
        '<error message="failed on setup with &quot;OSError: x&quot;">...</error></testcase>'
        "</testsuite></testsuites>"
    )
    text, clean = _script_module("gpu_check_summary").summary(report)
    assert text.splitlines() == [
        "PASSED   tests/gpu/test_a.py::test_ok",
        "SKIPPED  tests/gpu/test_a.py::test_skip[x]: no CUDA device",
        "FAILED   tests/gpu/test_b.py::test_bad: AssertionError: no CUDA graph was recorded",
        'ERROR    tests/gpu/test_b.py::test_setup: failed on setup with "OSError: x"',
        "gpu-check: 1 passed, 2 failed, 1 skipped",
    ]
    assert not clean


def test_the_wheel_trimmer_keeps_the_named_libraries_and_their_record(tmp_path: Path) -> None:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    members = ["pkg/__init__.py", "pkg/lib_cpu.so", "pkg/lib_cuda118.so", "pkg/lib_cuda130.so"]
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in members:
            archive.writestr(name, b"x")
        record = (
            "".join(f"{name},sha256=x,1\n" for name in members) + "pkg-1.0.dist-info/RECORD,,\n"
        )
        archive.writestr("pkg-1.0.dist-info/RECORD", record)
    dropped = _script_module("gpu_check_trim_wheel").trim(
        wheel, ["pkg/lib_cpu.so", "pkg/lib_cuda13*.so"]
    )
    assert dropped == ["pkg/lib_cuda118.so"]
    with zipfile.ZipFile(wheel) as archive:
        assert sorted(archive.namelist()) == sorted(
            [*(m for m in members if "118" not in m), "pkg-1.0.dist-info/RECORD"]
        )
        assert "lib_cuda118" not in archive.read("pkg-1.0.dist-info/RECORD").decode()
