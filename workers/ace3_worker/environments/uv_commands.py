"""What the worker asks ``uv`` to do, and how it reads the answers.

Two steps, both with the wheel-only rule (``--no-build``, unless ``ACE3_PIP_ALLOW_SOURCE_BUILDS``):

1. **Resolve** against the worker's own Python: ``uv pip install --dry-run --python <worker
   python> -c <installed set>``, so every package the worker has counts as installed and pinned
   to its version; the JSON report lists what would be added. Anything but an addition (a
   package uv would replace, reinstall or remove) is refused naming it: an environment only
   adds packages. A requirement that needs another version of an installed package (another
   torch) is uv's own "No solution found" error, which names it.
2. **Install** only the new pins, without dependencies (all resolved in step 1), into a target
   directory of their own: ``uv pip install --target <dir> --no-deps ...``.

Where wheels come from (``ACE3_PIP_*``) reaches uv through its environment variables, never its
command line (an index URL may carry credentials, and command lines are visible to every user
of the machine). uv gets a clean environment: no ``ACE3_*`` setting, no database or broker URL,
no cloud credentials; its configuration files are ignored (``UV_NO_CONFIG``) and it never
downloads a Python. In the sandbox, the variables of :data:`SECRET_VARIABLES` do not even reach
bubblewrap's command line (:func:`ace3_worker.sandbox.bubblewrap.secret_arguments`).

A failed step is either refused for good (:class:`EnvironmentRefusedError`: the resolver's
"No solution found", a malformed wheel, a limit) or may pass when tried again
(:class:`EnvironmentBuildError`: the index unreachable, a download cut, the disk full, uv
killed): :func:`uv_error` reads which from uv's own words.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from ace3_control.environment_settings import EnvironmentSettings

# What one step's JSON report may hold at most (a resolution of a few hundred packages is tens
# of kilobytes).
MAX_REPORT_BYTES = 4 << 20
ADDED = "installed"  # the one action of the dry-run's report an environment accepts
# uv's variables that may hold credentials (``https://user:token@host/simple``).
SECRET_VARIABLES = ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS")
# What uv says (0.13) when a step failed for a reason that may pass, as seen on real failures:
# the index unreachable, refused, slow or failing (uv retries, then says "Request failed
# after N retries"), a download cut, the index refusing the worker's credentials (a hint under
# "No solution found"), the wheelhouse missing, the disk full or failing. Anything else (the
# resolver's refusal, a malformed wheel, no wheel for this platform) fails again.
_MAY_PASS = (
    "Request failed after",
    "Failed to fetch",
    "error sending request",
    "error decoding response body",
    "error reading a body",
    "end of file before message length",
    "operation timed out",
    "Connection refused",
    "Connection reset",
    "dns error",
    "could not be queried due to",  # (401/403 from the index: the worker's credentials)
    "Failed to read `--find-links` directory",
    "No space left on device",
    "Disk quota exceeded",
    "Input/output error",
    "Too many open files",
    "Cannot allocate memory",
)
_SANDBOX_TOOLS = ("bwrap:", "setpriv:", "prlimit:")  # (the worker's sandbox failed, not uv)
_TOO_LARGE = "File too large (os error 27)"  # (RLIMIT_FSIZE, were SIGXFSZ ignored)


class EnvironmentRefusedError(RuntimeError):
    """The job's requirements cannot become an environment here; the message says why and
    names the package (the resolver's own explanation where it gave one)."""


class EnvironmentBuildError(RuntimeError):
    """The environment could not be built for a reason that may pass (the index unreachable, a
    download cut, the disk full, the store unavailable): the attempt is retried like one whose
    rank died, within the job's retry budget, and the environment's row is given up so that
    the next worker that needs it builds it. The message says what failed."""


class PreparationInterrupted(RuntimeError):
    """The attempt stopped waiting for or building its environment: the job was cancelled, or
    the attempt lost its lease, meanwhile (the attempt's keep-alive said so)."""


@dataclass(frozen=True)
class Pin:
    """One package the resolver added: installed as ``name==version``."""

    name: str
    version: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def constraints_text(installed: dict[str, str]) -> str:
    """The worker's installed set as a constraints file: one ``name==version`` a line."""
    return "".join(f"{name}=={version}\n" for name, version in sorted(installed.items()))


def _wheel_rule(settings: EnvironmentSettings) -> list[str]:
    return [] if settings.pip_allow_source_builds else ["--no-build"]


def _where_from(settings: EnvironmentSettings) -> list[str]:
    # (flags without secrets only: the locations themselves go through the environment)
    return ["--no-index", "--offline"] if settings.pip_offline else []


def resolve_argv(
    uv: str,
    python: str,
    constraints: PurePosixPath,
    requirements: Sequence[str],
    settings: EnvironmentSettings,
) -> list[str]:
    """Step 1: what the requirements add to the worker's Python (nothing is installed)."""
    return [
        uv, "pip", "install", "--dry-run", "--output-format", "json", "--python", python,
        "--no-config", *_wheel_rule(settings), *_where_from(settings),
        "-c", str(constraints), "--", *requirements,
    ]  # fmt: skip


def install_argv(
    uv: str,
    python: str,
    target: PurePosixPath,
    pins: Sequence[Pin],
    settings: EnvironmentSettings,
) -> list[str]:
    """Step 2: the pins alone (no dependencies: step 1 resolved them) into ``target``."""
    return [
        uv, "pip", "install", "--target", str(target), "--no-deps", "--python", python,
        "--no-config", *_wheel_rule(settings), *_where_from(settings),
        "--link-mode", "copy", "--compile-bytecode",
        "--", *(pin.requirement for pin in pins),
    ]  # fmt: skip


def uv_environment(
    settings: EnvironmentSettings, *, home: PurePosixPath, cache: PurePosixPath
) -> dict[str, str]:
    """uv's whole environment: where wheels come from, its own home and cache, nothing else of
    the worker's."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "UV_CACHE_DIR": str(cache),
        "UV_NO_CONFIG": "1",
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_PROGRESS": "1",
        "NO_COLOR": "1",
        "LANG": "C.UTF-8",
    }
    if settings.pip_index_url:
        env["UV_INDEX_URL"] = settings.pip_index_url
    if settings.pip_extra_index_url:
        env["UV_EXTRA_INDEX_URL"] = settings.pip_extra_index_url
    if settings.pip_find_links:
        env["UV_FIND_LINKS"] = settings.pip_find_links
    return env


def parse_resolution(stdout: str) -> list[Pin]:
    """The packages step 1 adds (sorted by name); a change that is not an addition is refused
    naming the package."""
    try:
        report = json.loads(stdout)
        changes = report["changes"]
        assert isinstance(changes, list)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise EnvironmentRefusedError(
            f"uv's resolution report is not what the worker reads: {stdout[:300]!r}"
        ) from None
    pins: dict[str, Pin] = {}
    for change in changes:
        name, version, action = change.get("name"), change.get("version"), change.get("action")
        if not isinstance(name, str) or not isinstance(version, str):
            raise EnvironmentRefusedError(f"uv's resolution names no package: {change!r}")
        if action != ADDED:
            raise EnvironmentRefusedError(
                f"{name} {version} would change the worker's own installation (uv: {action}); "
                "an environment may only add packages to it"
            )
        pins[name] = Pin(name, version)
    return [pins[name] for name in sorted(pins)]


def uv_failure(stderr_tail: Sequence[str], returncode: int) -> str:
    """uv's explanation of a failed step: its output from its first ``error:`` line (the
    resolver's "No solution found ... Because you require ..."), as one string."""
    lines = [line.rstrip() for line in stderr_tail if line.strip()]
    for index, line in enumerate(lines):
        if line.lstrip().startswith("error:"):
            lines = lines[index:]
            break
    text = " ".join(" ".join(lines).split())
    return text.removeprefix("error: ") if text else f"uv exited with {returncode}"


def killed_by(returncode: int) -> int | None:
    """The signal that ended the step: a negative return code (uv itself), or 128 + N
    (bubblewrap reports its command killed so; uv's own codes are small)."""
    if returncode < 0:
        return -returncode
    if 128 < returncode < 128 + signal.NSIG:
        return returncode - 128
    return None


def uv_error(
    stderr_tail: Sequence[str], returncode: int, max_bytes: int
) -> EnvironmentRefusedError | EnvironmentBuildError:
    """What a failed step raises: refused for good (the resolver's refusal, a malformed wheel,
    a file past ``RLIMIT_FSIZE``, i.e. ``ACE3_ENV_MAX_BYTES``), or a build error that may pass
    (the index unreachable, a download cut, the disk full, uv killed by another signal, the
    sandbox failing to start) -- see :data:`_MAY_PASS`."""
    text = uv_failure(stderr_tail, returncode)
    signum = killed_by(returncode)
    if signum == signal.SIGXFSZ or _TOO_LARGE in text:
        return EnvironmentRefusedError(
            f"the environment is larger than ACE3_ENV_MAX_BYTES ({max_bytes} bytes): a file "
            "of it reached that size"
        )
    if signum is not None:
        name = signal.Signals(signum).name if signum in signal.valid_signals() else str(signum)
        return EnvironmentBuildError(f"uv was killed by {name}: {text}")
    lines = [line.strip() for line in stderr_tail]
    if any(marker in text for marker in _MAY_PASS) or any(
        line.startswith(_SANDBOX_TOOLS) for line in lines
    ):
        return EnvironmentBuildError(text)
    if not any(line.startswith("error:") for line in lines):
        return EnvironmentBuildError(text)  # (uv said nothing of why: nothing says it is final)
    return EnvironmentRefusedError(text)
