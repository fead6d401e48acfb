"""Why an attempt's torchrun failed, in one headline, and whether another attempt may help.

torchrun runs with ``--max-restarts=0`` and exits 1 whatever killed a rank; its error summary on
stderr names the first failure (``Root Cause``: the rank and its exit code, negative for a
signal). A rank killed by a signal (the kernel's OOM killer, a stray ``kill -9``, a crashed
node) is retried from the last verified checkpoint while the job's retry budget lasts, like
Determined's ``max_restarts``; a rank that raised an exception fails the job (its code would
raise it again), and so does one that passed its CPU-time or file-size limit.

Which rank failed first is told by the ranks' own ``rank_failure`` records (each written with a
nanosecond time by the rank that raised, :class:`ace3.config.events.RankFailureRecord`): the
earliest is the headline and the later ones its consequences (a peer waiting in a collective
fails on the closed connection, and may well be the last to write to stderr). Without a record
(a rank killed by a signal writes none, and a job may fail before its first), the rank that
wrote to stderr last is named, as before.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ace3.config.events import RankFailureRecord
from ace3_control.job_nodes import echoes_a_peer
from ace3_worker.sandbox.limits import JobLimits

_ROOT_CAUSE = "Root Cause (first observed failure):"
_RANK_LINE = re.compile(r"^\s*rank\s*:\s*(\d{1,7})\b")
_EXIT_LINE = re.compile(r"^\s*exitcode\s*:\s*(-?\d{1,4})\b")

# What a signal most likely means for a training process.
_SIGNAL_HINTS = {
    signal.SIGKILL: "out of memory?",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGABRT: "aborted",
    signal.SIGXCPU: "it used up its CPU-time limit",
    signal.SIGXFSZ: "it wrote a file past its size limit",
}
# Signals that another attempt would meet again.
NOT_RETRIED = frozenset({signal.SIGXCPU, signal.SIGXFSZ})


@dataclass(frozen=True)
class RankFailure:
    """The first rank that failed, as torchrun reports it."""

    rank: int
    exit_code: int

    @property
    def signal(self) -> signal.Signals | None:
        if self.exit_code >= 0:
            return None
        try:
            return signal.Signals(-self.exit_code)
        except ValueError:
            return None

    @property
    def retryable(self) -> bool:
        return self.signal is not None and self.signal not in NOT_RETRIED

    def headline(self) -> str:
        """``rank 1 killed by SIGKILL (out of memory?)``"""
        sig = self.signal
        if sig is None:
            return f"rank {self.rank} exited with code {self.exit_code}"
        hint = _SIGNAL_HINTS.get(sig)
        return f"rank {self.rank} killed by {sig.name}" + (f" ({hint})" if hint else "")


def _entries(lines: list[str]) -> list[RankFailure]:
    """Every ``rank`` / ``exitcode`` entry of torchrun's error summary, in order."""
    entries: list[RankFailure] = []
    rank: int | None = None
    for line in lines:
        if match := _RANK_LINE.match(line):
            rank = int(match.group(1))
        elif rank is not None and (match := _EXIT_LINE.match(line)):
            entries.append(RankFailure(rank, int(match.group(1))))
            rank = None
    return entries


def _last_summary(
    launcher_lines: Iterable[str],
) -> tuple[list[RankFailure], list[RankFailure]] | None:
    """Torchrun's last error summary: the entries of its ``Failures:`` section and of its
    ``Root Cause``; None without one."""
    lines = list(launcher_lines)
    starts = [index for index, line in enumerate(lines) if _ROOT_CAUSE in line]
    if not starts:
        return None
    summary_start = max(  # (the tail may have lost the header of a long summary)
        (index for index, line in enumerate(lines[: starts[-1]]) if "Failures:" in line),
        default=0,
    )
    return _entries(lines[summary_start : starts[-1]]), _entries(lines[starts[-1] :])


def failed_ranks(launcher_lines: Iterable[str]) -> list[RankFailure]:
    """Every rank of torchrun's last error summary (its ``Failures:`` and its ``Root Cause``),
    in order; empty without a summary."""
    summary = _last_summary(launcher_lines)
    return summary[0] + summary[1] if summary is not None else []


def root_cause(
    launcher_lines: Iterable[str], rank_stderr: Iterable[tuple[int, str]] = ()
) -> RankFailure | None:
    """What failed first, from torchrun's error summary: its ``Root Cause`` entry, unless that
    is a rank whose last error (in ``rank_stderr``) only echoes a peer's death (gloo's
    "Connection reset by peer"...) while another rank was killed by a signal: the killed rank is
    the cause. SIGTERM does not count, since torchrun sends it to the surviving ranks itself."""
    summary = _last_summary(launcher_lines)
    if summary is None:
        return None
    failures, roots = summary
    root = roots[0] if roots else None
    if root is None or root.signal is not None:
        return root
    root_lines = [line for rank, line in rank_stderr if rank == root.rank]
    if not echoes_a_peer("\n".join(root_lines[-5:])):
        return root
    killed = [
        entry for entry in failures if entry.signal is not None and entry.signal != signal.SIGTERM
    ]
    return killed[0] if killed else root


def limit_hint(exception: str, limits: JobLimits | None) -> str:
    """What a job's limit has to do with an exception line (empty when nothing)."""
    if limits is None:
        return ""
    if exception.startswith("MemoryError") or "can't allocate memory" in exception:
        return f" (each process of a job may allocate {limits.memory_bytes >> 20} MiB)"
    if "Resource temporarily unavailable" in exception and "Errno 11" in exception:
        return f" (a job may run {limits.max_processes} processes and threads)"
    if "File too large" in exception and "Errno 27" in exception and limits.disk_bytes:
        return f" (a job's files may hold {limits.disk_bytes} bytes: ACE3_JOB_DISK_BYTES)"
    return ""


# Consequences named after the headline at most (each cut), so the message stays readable.
MAX_CONSEQUENCES = 8
_CONSEQUENCE_CHARS = 300


def _error(record: RankFailureRecord) -> str:
    """``ValueError: bad value`` (as a traceback's last line reads)."""
    return f"{record.error_type}: {record.message}" if record.message else record.error_type


def consequences(records: Sequence[RankFailureRecord]) -> list[str]:
    """The lines naming the failures after the first (``records`` earliest first), with how
    long after it each came."""
    first = records[0]
    lines = [
        f"then rank {record.rank}, {(record.time_ns - first.time_ns) / 1e9:.3f} s later: "
        + _error(record)[:_CONSEQUENCE_CHARS]
        for record in records[1 : MAX_CONSEQUENCES + 1]
    ]
    if len(records) > MAX_CONSEQUENCES + 1:
        lines.append(f"(and {len(records) - MAX_CONSEQUENCES - 1} more failures)")
    return lines


def failure_message(
    returncode: int,
    rank_stderr: Iterable[tuple[int, str]],
    launcher_stderr: Iterable[str],
    cause: RankFailure | None = None,
    limits: JobLimits | None = None,
    rank_failures: Sequence[RankFailureRecord] = (),
) -> str:
    """One line naming what failed (the signal that killed a rank; else the earliest of the
    ranks' failure records, followed by the later ones, its consequences; else the exception
    of the rank that wrote to stderr last), then that rank's stderr (or torchrun's)."""
    rank_lines = list(rank_stderr)
    records = sorted(rank_failures, key=lambda record: (record.time_ns, record.rank))
    if cause is not None and cause.signal is not None:
        lines = [line for rank, line in rank_lines if rank == cause.rank] or list(launcher_stderr)
        headline = f"training failed: {cause.headline()}"
    elif records:
        first = records[0]
        exception = _error(first)
        lines = consequences(records) + (
            [line for rank, line in rank_lines if rank == first.rank] or list(launcher_stderr)
        )
        headline = (
            f"training exited with code {returncode}: rank {first.rank}: {exception}"
            + limit_hint(exception, limits)
        )
    elif rank_lines:
        first_rank = rank_lines[-1][0]
        lines = [line for rank, line in rank_lines if rank == first_rank]
        exception = next((line for line in reversed(lines) if line and not line[0].isspace()), "")
        headline = (
            f"training exited with code {returncode}: rank {first_rank}: {exception}"
            + limit_hint(exception, limits)
        )
    else:
        lines = list(launcher_stderr)
        headline = f"training exited with code {returncode}"
    return (headline + "\n" + "\n".join(lines))[:8000]
