"""Per-job environments (issue 28): what building, fetching and reusing one costs.

A wheelhouse of ``--packages`` synthetic wheels (``--modules`` modules of 4 KiB each, one
dependency chain through them) written by ``tests/wheelhouse.py``, then, ``--repeats`` times
each (medians):

- **cold build, uv**: the worker's whole build (:class:`ace3_worker.environments.build.EnvironmentBuilder`:
  resolve against the worker's Python, install the pins, bytecode compiled, tree made read-only),
  in the worker's sandbox (bubblewrap as ``ACE3_ENV_BUILD_UID`` when root, else none);
- **cold build, pip**: ``pip install --target`` of the same requirement from the same
  wheelhouse (no cache, bytecode compiled, resolving the same chain); the ratio pip / uv;
- **fetch from the store**: an environment another worker built, into an empty cache (archive
  fetched and verified, unpacked, installed: :meth:`EnvironmentPreparer.prepare` finding the row
  ready);
- **warm reuse**: what the environment adds to a job's start once the machine has it (the pin,
  the row's ``last_used_at``, the job row, and the tree hard-linked into the attempt directory).
  Goal: at most 0.3 s.

    .venv/bin/python benchmarks/environments.py [--packages 8] [--modules 40] [--repeats 5]

Needs nothing but the repository (SQLite, a local store, no network).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.settings import Settings
from ace3_control.storage import open_store
from ace3_server.migrations_check import upgrade
from ace3_worker.environments.build import EnvironmentBuilder
from ace3_worker.environments.cache import link_tree, remove_tree
from ace3_worker.environments.prepare import EnvironmentPreparer
from ace3_worker.sandbox.plan import SandboxPlan, protected_paths, runtime_paths
from tests.wheelhouse import make_wheel


def write_wheelhouse(root: Path, packages: int, modules: int) -> str:
    """``bench0`` ... ``bench<n-1>``, each needing the next; the requirement of the first."""
    root.mkdir(mode=0o755)
    for index in range(packages):
        name = f"bench{index}"
        files = {f"{name}/m{k}.py": f"X{k} = {k!r}\n" + "#" * 4096 + "\n" for k in range(modules)}
        files[f"{name}/__init__.py"] = "VALUE = 1\n"
        requires = [f"bench{index + 1}>=1"] if index + 1 < packages else []
        make_wheel(root, name, "1.0", files, requires)
    for wheel in root.iterdir():
        wheel.chmod(0o644)
    return "bench0"


def plan_for(settings: Settings) -> SandboxPlan:
    """The worker's sandbox where this machine has one (root and bubblewrap), else none."""
    if os.geteuid() == 0 and shutil.which("bwrap"):
        return SandboxPlan("bwrap", True, runtime_paths(), protected_paths(settings))
    return SandboxPlan("none", False, (), ())


def quiet(text: str) -> None:
    """The job log's lines, not printed."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", type=int, default=8)
    parser.add_argument("--modules", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ace3-bench-env-"))
    root.chmod(0o755)
    try:
        wheelhouse = root / "wheelhouse"
        requirement = write_wheelhouse(wheelhouse, args.packages, args.modules)
        settings = Settings(
            data_dir=root / "data", pip_find_links=str(wheelhouse), pip_offline=True
        )
        (root / "data").mkdir()
        plan = plan_for(settings)
        upgrade(settings.resolved_database_url)
        sessions = sync_session_factory(make_sync_engine(settings.resolved_database_url))
        store = open_store(settings)

        uv_times, pip_times = [], []
        for repeat in range(args.repeats):
            scratch = root / f"uv-{repeat}"
            scratch.mkdir()
            started = time.perf_counter()
            EnvironmentBuilder(settings, plan).build([requirement], scratch)
            uv_times.append(time.perf_counter() - started)
            remove_tree(scratch)
            target = root / f"pip-{repeat}"
            pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                   "--find-links", str(wheelhouse), "--no-cache-dir",
                   "--disable-pip-version-check", "--target", str(target), requirement]  # fmt: skip
            started = time.perf_counter()
            subprocess.run(pip, check=True)
            pip_times.append(time.perf_counter() - started)
            shutil.rmtree(target)

        # One worker builds it (into the store); each fetch is another worker's empty cache.
        builder_worker = EnvironmentPreparer(settings, sessions, store, lambda: plan, "builder")
        builder_worker.prepare("no-job", 1, [requirement], quiet).release()
        fetch_times, reuse_times = [], []
        for repeat in range(args.repeats):
            other = settings.model_copy(update={"env_cache_dir": root / f"cache-{repeat}"})
            worker = EnvironmentPreparer(other, sessions, store, lambda: plan, f"w{repeat}")
            started = time.perf_counter()
            worker.prepare("no-job", 1, [requirement], quiet).release()
            fetch_times.append(time.perf_counter() - started)
            job = root / f"job-{repeat}"
            job.mkdir()
            started = time.perf_counter()
            prepared = worker.prepare("no-job", 1, [requirement], quiet)
            link_tree(prepared.path, job / "env")
            reuse_times.append(time.perf_counter() - started)
            prepared.release()
        uv, pip_median = statistics.median(uv_times), statistics.median(pip_times)
        fetch, reuse = statistics.median(fetch_times), statistics.median(reuse_times)
        files = args.packages * (args.modules + 1)
        print(
            f"\n{args.packages} packages, {files} modules, {args.repeats} repeats, "
            f"build sandbox: {plan.mode}\n"
        )
        print(f"{'':28} {'median s':>9} {'fastest s':>10}")
        for label, times in (
            ("cold build, uv (worker)", uv_times),
            ("cold build, pip --target", pip_times),
            ("fetch from the store", fetch_times),
            ("warm reuse (job start)", reuse_times),
        ):
            print(f"{label:28} {statistics.median(times):>9.3f} {min(times):>10.3f}")
        print(f"\npip / uv: {pip_median / uv:.2f}   fetch / uv build: {fetch / uv:.2f}")
        print(f"warm reuse adds {reuse:.3f} s to a job's start (goal: at most 0.3 s)")
    finally:
        remove_tree(root)


if __name__ == "__main__":
    main()
