"""Which sandbox this worker runs jobs in, decided once per worker process and checked for real.

``ACE3_SANDBOX``:

- ``bwrap``: bubblewrap namespaces (:mod:`ace3_worker.sandbox.bubblewrap`); a worker running as
  root also gives every job its own uid (:mod:`ace3_worker.sandbox.identity`).
- ``uid``: the fallback where namespaces are not allowed: a root worker runs the job as its own
  uid (``setpriv``, ``no_new_privs``), with the rlimits and with file permissions that keep the
  data directory, the store and the database away from it. The job sees the machine's
  filesystem as that uid, and the network: the database and the broker must then require
  passwords it cannot read (docs/security.md).
- ``none``: no isolation, for your own code on your own machine only.
- ``auto`` (the default): ``bwrap`` when it runs here, else ``uid`` when the worker is root,
  else the worker refuses to start and says what to install.

The decision is checked by starting a real sandbox that imports ``ace3`` (so a Python
installation the job's uid cannot read is found at start, not by the first job).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import ace3
from ace3_control.settings import Settings
from ace3_worker.sandbox.bubblewrap import (
    JOB_ROOT,
    SandboxView,
    UidSwitch,
    bubblewrap_argv,
    setpriv_prefix,
)
from ace3_worker.sandbox.identity import check_uid_range, lease_identity
from ace3_worker.sandbox.seccomp import filter_program

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 60


class SandboxUnavailableError(RuntimeError):
    """The configured sandbox cannot run on this machine; the message says what to do."""


@dataclass(frozen=True)
class SandboxPlan:
    """How this worker runs every job (see the module docstring)."""

    mode: str  # "bwrap" | "uid" | "none"
    dedicated_uids: bool  # a root worker: each job runs as a uid of its own
    runtime_paths: tuple[Path, ...]  # the worker's Python, bound read-only into the sandbox
    hidden: tuple[Path, ...]  # service paths that must never be visible to a job

    @property
    def visible_root(self) -> PurePosixPath | None:
        """Where a job sees its directory (None: at its real path)."""
        return JOB_ROOT if self.mode == "bwrap" else None

    def describe(self) -> str:
        if self.mode == "bwrap":
            who = "a dedicated uid per job" if self.dedicated_uids else "the worker's own uid"
            return f"bubblewrap namespaces, {who}"
        if self.mode == "uid":
            return "a dedicated uid per job with rlimits (no namespaces)"
        return "NONE: jobs run with the worker's own privileges"


def runtime_paths() -> tuple[Path, ...]:
    """The directories a rank's Python needs: the interpreter's prefix, the virtual
    environment, and where ``ace3`` is imported from (an editable install's source tree)."""
    candidates = [Path(sys.base_prefix), Path(sys.prefix), Path(ace3.__file__).parent.parent]
    found: list[Path] = []
    for path in candidates:
        for variant in (path, path.resolve()):
            if variant.is_dir() and variant != Path("/") and variant not in found:
                found.append(variant)
    return tuple(found)


def protected_paths(settings: Settings) -> tuple[Path, ...]:
    """What a job must never see: the service's data, store, work and broker directories,
    the lock directory, the dataset shard cache (a job sees its own shards through their links
    alone), the environment cache (likewise: a job sees its own environment's links) and the
    SQLite database with its journal files."""
    paths = [
        settings.data_dir.resolve(),
        settings.resolved_storage_dir,
        settings.resolved_work_dir,
        settings.broker_dir,
        settings.sandbox_lock_dir,
        settings.resolved_dataset_cache_dir,
        settings.resolved_env_cache_dir,
    ]
    database = settings.resolved_database_url
    if database.startswith("sqlite:///"):
        file = Path(database.removeprefix("sqlite:///")).resolve()
        paths += [file, Path(f"{file}-wal"), Path(f"{file}-shm"), Path(f"{file}-journal")]
    return tuple(dict.fromkeys(paths))


PROBE_COMMAND = (
    sys.executable,
    "-I",
    "-c",
    "import ace3.runtime.process.parent_death; print('sandbox ok')",
)


def probe(plan: SandboxPlan, settings: Settings) -> None:
    """Start a real sandbox of this plan that imports ``ace3``; raise what went wrong."""
    if plan.mode == "none":
        return
    work = settings.resolved_work_dir
    work.mkdir(parents=True, exist_ok=True)
    identity = (
        lease_identity(settings.sandbox_lock_dir, settings.sandbox_uid_base,
                       settings.sandbox_uid_count)
        if plan.dedicated_uids
        else None
    )  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix=".probe-", dir=work))
    try:
        scratch.chmod(0o755)
        for name in ("output", "home", "tmp"):
            (scratch / name).mkdir()
            if identity is not None:
                os.chown(scratch / name, identity.uid, identity.gid)
        command = list(PROBE_COMMAND)
        pass_fds: tuple[int, ...] = ()
        if plan.mode == "bwrap":
            read_fd, write_fd = os.pipe()
            os.write(write_fd, filter_program())
            os.close(write_fd)
            pass_fds = (read_fd,)
            view = SandboxView(
                job_root=scratch,
                writable=((scratch / "tmp", PurePosixPath("/tmp")),),
                read_only_files=(),
                runtime_paths=plan.runtime_paths,
                hidden=plan.hidden,
                env={"PATH": "/usr/bin:/bin"},
                switch=UidSwitch(identity.uid, identity.gid) if identity else None,
            )
            argv = bubblewrap_argv(view, command, seccomp_fd=read_fd, info_fd=None)
        else:
            assert identity is not None
            argv = setpriv_prefix(identity.uid, identity.gid, no_new_privs=True) + command
        try:
            result = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_SECONDS,
                pass_fds=pass_fds,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                cwd=scratch,
            )
        finally:
            for fd in pass_fds:
                os.close(fd)
        if result.returncode != 0 or "sandbox ok" not in result.stdout:
            hint = (
                f"; the job's uid must be able to run {sys.executable} and import ace3: install "
                "Python where it is readable by other users (e.g. /usr/local or /opt), not "
                "under a private home directory"
                if plan.mode == "uid"
                else ""
            )
            raise SandboxUnavailableError(
                f"a {plan.mode} sandbox does not run here ({result.stderr.strip()[-500:]}){hint}"
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if identity is not None:
            identity.release()


def _is_root() -> bool:
    return os.geteuid() == 0


def _plan(mode: str, settings: Settings) -> SandboxPlan:
    return SandboxPlan(
        mode=mode,
        dedicated_uids=_is_root() and mode in ("bwrap", "uid"),
        runtime_paths=runtime_paths(),
        hidden=protected_paths(settings),
    )


def _check_prerequisites(mode: str, settings: Settings) -> None:
    if mode == "bwrap" and shutil.which("bwrap") is None:
        raise SandboxUnavailableError(
            "bubblewrap is not installed: apt-get install bubblewrap (or dnf install "
            "bubblewrap), or choose another ACE3_SANDBOX (docs/security.md)"
        )
    if mode == "uid" and not _is_root():
        raise SandboxUnavailableError(
            "ACE3_SANDBOX=uid switches every job to a uid of its own, which needs a worker "
            "running as root"
        )
    if (mode == "uid" or (mode == "bwrap" and _is_root())) and shutil.which("setpriv") is None:
        raise SandboxUnavailableError("setpriv is not installed: apt-get install util-linux")
    if _is_root() and mode in ("bwrap", "uid"):
        try:
            check_uid_range(settings.sandbox_uid_base, settings.sandbox_uid_count)
        except ValueError as exc:
            raise SandboxUnavailableError(str(exc)) from exc
    if not sys.platform.startswith("linux") and mode != "none":
        raise SandboxUnavailableError(
            f"the job sandbox needs Linux; on {sys.platform} set ACE3_SANDBOX=none and run "
            "only code you trust"
        )


def harden_service_paths(settings: Settings) -> None:
    """Keep the service's files away from job uids by their permissions too (what holds them
    back without namespaces): the store, the broker, the lock directory, the dataset shard
    cache and the environment cache are the worker's alone, the data and work directories can be passed through but not listed, the SQLite
    database is private."""
    modes = [
        (settings.data_dir.resolve(), 0o711),
        (settings.resolved_work_dir, 0o711),
        (settings.resolved_storage_dir, 0o700),
        (settings.broker_dir, 0o700),
        (settings.sandbox_lock_dir, 0o700),
        (settings.resolved_dataset_cache_dir, 0o700),
        (settings.resolved_env_cache_dir, 0o700),
    ]
    for path in protected_paths(settings):
        if path.is_file():
            modes.append((path, 0o600))
    for path, mode in modes:
        if path.exists() and path.stat().st_uid == os.geteuid():
            path.chmod(mode)


def resolve_sandbox(settings: Settings) -> SandboxPlan:
    """The sandbox this worker will use, checked by a probe (see the module docstring)."""
    wanted = settings.sandbox
    if _is_root() and wanted != "none":
        harden_service_paths(settings)
    if wanted != "auto":
        _check_prerequisites(wanted, settings)
        plan = _plan(wanted, settings)
        probe(plan, settings)
        return plan
    problems = []
    for mode in ("bwrap", "uid"):
        try:
            _check_prerequisites(mode, settings)
            plan = _plan(mode, settings)
            probe(plan, settings)
            return plan
        except SandboxUnavailableError as exc:
            problems.append(f"{mode}: {exc}")
    raise SandboxUnavailableError(
        "no job sandbox works on this machine, so this worker will not run untrusted code ("
        + "; ".join(problems)
        + "). Install bubblewrap (apt-get install bubblewrap) and run the worker as root, or "
        "set ACE3_SANDBOX=none to run only code you trust (docs/security.md)"
    )


_resolved: dict[tuple[str, Path, str], SandboxPlan] = {}


def sandbox_plan(settings: Settings) -> SandboxPlan:
    """The plan of this worker process (resolved once; Celery's pool children inherit the one
    the main process resolved at start)."""
    key = (settings.sandbox, settings.resolved_work_dir, settings.resolved_database_url)
    if key not in _resolved:
        plan = resolve_sandbox(settings)
        level = logging.WARNING if plan.mode != "bwrap" else logging.INFO
        logger.log(level, "job sandbox: %s", plan.describe())
        _resolved[key] = plan
    return _resolved[key]
