"""The bubblewrap command line that runs one attempt's processes in their own namespaces.

What a job sees (``JOB_ROOT`` is ``/job``)::

    /usr, /bin, /lib...          the system, read-only
    /etc/<a few files>           loader cache, name resolution, certificates, time zone;
                                 /etc/passwd and /etc/group generated for the job's uid
    <python prefix, venv, ace3>  the worker's Python, read-only, at the same paths
    /job                         the attempt directory, read-only (job.json, code/, data/,
                                 resume/: copies, never links into the store)
    /job/output /job/home /tmp   the job's writable directories (on the worker's disk)
    /proc /dev /dev/shm          its own: PID namespace, minimal devices, a bounded tmpfs
    GPU device nodes             a CUDA worker's GPUs and control nodes, nothing else

Nothing else of the machine exists inside: not the data directory, the artifact store, the
SQLite database, the broker's files or other jobs. The PID, IPC, UTS and cgroup namespaces are
always the job's own; single-node jobs also get their own network namespace (loopback only),
multi-node jobs share the host's network (the rendezvous needs it). A worker running as root
runs bubblewrap as root (no user namespace: the mounts need no unprivileged user namespaces,
and read what root can read) and the sandbox's command is ``setpriv`` switching to the job's
uid before anything of the job runs: seen from outside the sandbox, the job's processes run as
that uid, with no capabilities and ``no_new_privs``. A worker that is not root runs bubblewrap
in a user namespace, as its own uid. Every process gets the seccomp filter of
:mod:`ace3_worker.sandbox.seccomp`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

JOB_ROOT = PurePosixPath("/job")
SANDBOX_HOSTNAME = "ace3-job"
# /etc/hosts of a job on its own network: its name resolves (torchrun looks it up) to loopback.
ISOLATED_HOSTS = f"127.0.0.1 localhost {SANDBOX_HOSTNAME}\n::1 localhost ip6-localhost\n"

# Files of /etc a Python process (and NCCL's name resolution) needs; the rest of /etc stays out.
ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "resolv.conf",
    "gai.conf",
    "protocols",
    "services",
    "mime.types",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
)
# Top-level system directories (or the symlinks to /usr/... that merged-/usr systems have).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True)
class UidSwitch:
    """Run the command as this uid/gid (the sandbox's command becomes ``setpriv ...``)."""

    uid: int
    gid: int


@dataclass(frozen=True)
class SandboxView:
    """Everything the command line is built from: no decision is left to the builder."""

    job_root: Path  # the attempt directory: read-only at /job
    writable: tuple[tuple[Path, PurePosixPath], ...]  # (real directory, where the job sees it)
    read_only_files: tuple[tuple[Path, PurePosixPath], ...]  # e.g. the generated /etc/passwd
    runtime_paths: tuple[Path, ...]  # the worker's Python (prefix, venv, ace3), read-only
    hidden: tuple[Path, ...] = ()  # paths under a bound directory that must not be seen
    share_network: bool = False
    device_nodes: tuple[str, ...] = ()
    shm_bytes: int = 1 << 30
    env: dict[str, str] = field(default_factory=dict)
    switch: UidSwitch | None = None  # root: switch to this uid inside; None: a user namespace
    # Variables that must never be on a command line (an index URL with its credentials: every
    # local user reads /proc/<pid>/cmdline): bubblewrap reads them from ``args_fd``
    # (:func:`secret_arguments`), after ``--clearenv`` like the others.
    secret_env: dict[str, str] = field(default_factory=dict)


def _ancestors(path: PurePosixPath) -> list[PurePosixPath]:
    return list(reversed(path.parents))[1:]  # without "/"


def _covered(path: PurePosixPath, mounted: Sequence[PurePosixPath]) -> bool:
    return any(path == top or top in path.parents for top in mounted)


def bubblewrap_argv(
    view: SandboxView,
    command: Sequence[str],
    *,
    seccomp_fd: int | None,
    info_fd: int | None,
    args_fd: int | None = None,
    bwrap: str = "bwrap",
    root: Path = Path("/"),
) -> list[str]:
    """The whole command line: ``bwrap <options> -- [setpriv ... --] <command>``.

    ``args_fd``: a pipe holding :func:`secret_arguments` (required when ``view.secret_env`` is
    not empty). ``root`` is where the system directories are looked up (tests pass a fake one)."""
    if view.secret_env and args_fd is None:
        raise ValueError("secret variables need an args_fd: never on the command line")
    argv = [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    argv += ["--unshare-cgroup-try"]
    if not view.share_network:  # (on the host's network, the host's name stays: peers use it)
        argv += ["--unshare-net", "--hostname", SANDBOX_HOSTNAME]
    if view.switch is None:
        argv += ["--unshare-user", "--disable-userns"]
    else:
        # bubblewrap runs as root: keep only what setpriv needs to become the job's uid.
        argv += ["--cap-drop", "ALL"]
        for capability in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"):
            argv += ["--cap-add", capability]
    mounted: list[PurePosixPath] = []  # everything mounted (nothing goes below these)
    same_path: list[PurePosixPath] = []  # mounted where they are on the host
    for name in SYSTEM_DIRS:
        source = root / name
        if source.is_symlink():
            argv += ["--symlink", os.readlink(source), f"/{name}"]
        elif source.is_dir():
            argv += ["--ro-bind", str(source), f"/{name}"]
            mounted.append(PurePosixPath(f"/{name}"))
            same_path.append(PurePosixPath(f"/{name}"))
    argv += ["--perms", "0755", "--dir", "/etc"]  # (bwrap makes missing parents 0700)
    for name in ETC_FILES:
        if (root / "etc" / name).exists():
            argv += ["--ro-bind", str(root / "etc" / name), f"/etc/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", str(view.shm_bytes), "--tmpfs", "/dev/shm"]
    for node in view.device_nodes:
        argv += ["--dev-bind", node, node]
    if view.device_nodes:
        argv += ["--ro-bind", "/sys", "/sys"]  # (the CUDA driver and NCCL read the topology)
        mounted.append(PurePosixPath("/sys"))
        same_path.append(PurePosixPath("/sys"))
    for real, inside in view.read_only_files:
        argv += ["--ro-bind", str(real), str(inside)]
    # The job's own directories come before the Python paths: a venv under /tmp (a CI checkout)
    # must be mounted on top of the job's /tmp, not hidden by it.
    argv += ["--ro-bind", str(view.job_root), str(JOB_ROOT)]
    for real, inside in view.writable:
        argv += ["--bind", str(real), str(inside)]
        mounted.append(inside)
    created: set[PurePosixPath] = set(mounted)
    for path in view.runtime_paths:
        inside = PurePosixPath(path)
        if _covered(inside, same_path):
            continue  # (already there: the system's /usr, or a runtime path bound before)
        for ancestor in _ancestors(inside):
            if ancestor not in created and not _covered(ancestor, same_path):
                argv += ["--perms", "0755", "--dir", str(ancestor)]
                created.add(ancestor)
        argv += ["--ro-bind", str(path), str(inside)]
        mounted.append(inside)
        same_path.append(inside)
    for path in view.hidden:
        inside = PurePosixPath(path)
        if not _covered(inside, same_path):
            continue
        if path.is_dir():
            argv += ["--tmpfs", str(inside)]
        elif path.exists():
            argv += ["--ro-bind", "/dev/null", str(inside)]
    argv += ["--clearenv"]
    for key, value in sorted(view.env.items()):
        argv += ["--setenv", key, value]
    if view.secret_env:
        argv += ["--args", str(args_fd)]  # (parsed in place: after --clearenv)
    argv += ["--chdir", str(JOB_ROOT)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    argv.append("--")
    if view.switch is not None:
        argv += setpriv_prefix(view.switch.uid, view.switch.gid)
    return argv + list(command)


def secret_arguments(view: SandboxView) -> bytes:
    """``--setenv KEY VALUE`` for each of ``view.secret_env``, NUL-separated: what bubblewrap's
    ``--args FD`` reads from a pipe, so that the values never appear in any process's argv."""
    parts: list[str] = []
    for key, value in sorted(view.secret_env.items()):
        if "\0" in key or "\0" in value or key in view.env:
            raise ValueError(f"{key}: not a variable bubblewrap can pass")
        parts += ["--setenv", key, value]
    return b"".join(part.encode() + b"\0" for part in parts)


def setpriv_prefix(uid: int, gid: int, *, no_new_privs: bool = False) -> list[str]:
    """``setpriv`` becoming ``uid``/``gid`` for good: no supplementary groups, no capabilities
    (none inheritable, an empty bounding set), optionally ``no_new_privs``."""
    argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    argv += ["--inh-caps=-all", "--bounding-set=-all"]
    if no_new_privs:
        argv.append("--no-new-privs")
    return [*argv, "--"]
