"""Per-rank log prefixing of stdout and stderr."""

from __future__ import annotations

import io
import os
import queue
import subprocess
import sys
import threading

from ace3.runtime.process.log_prefix import MAX_LINE_CHARS, PIPE_BUF, PrefixedStream
from ace3_worker.reports import LogLine


def test_every_line_is_prefixed() -> None:
    target = io.StringIO()
    stream = PrefixedStream(target, "[rank 3] ")
    stream.write("one\ntwo\n")
    stream.write("thr")
    assert target.getvalue() == "[rank 3] one\n[rank 3] two\n"  # partial line held back
    stream.write("ee\nfour")
    stream.flush()
    stream.write(" more\n")
    assert target.getvalue() == ("[rank 3] one\n[rank 3] two\n[rank 3] three\n[rank 3] four more\n")


def test_empty_lines_are_prefixed() -> None:
    target = io.StringIO()
    stream = PrefixedStream(target, "[rank 0] ")
    print("a\n\nb", file=stream)
    assert target.getvalue() == "[rank 0] a\n[rank 0] \n[rank 0] b\n"


def test_process_streams_and_traceback_prefixed() -> None:
    code = (
        "import sys, warnings\n"
        "from ace3.runtime.process.log_prefix import install_log_prefix\n"
        "install_log_prefix(1)\n"
        "print('hello')\n"
        "warnings.warn('careful')\n"
        "raise SystemExit(sys.stderr.write('bye\\n') and 3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout == "[rank 1] hello\n"
    lines = [line for line in done.stderr.splitlines() if line]
    assert lines and all(line.startswith("[rank 1] ") for line in lines)
    assert "[rank 1] bye" in lines


def test_runtime_entry_reports_errors_with_exit_1(tmp_path) -> None:
    missing = tmp_path / "missing.json"
    done = subprocess.run(
        [sys.executable, "-m", "ace3.runtime", "--job", str(missing)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "[rank 0] Traceback (most recent call last):" in done.stderr
    assert f"[rank 0] FileNotFoundError: job file not found: {missing}" in done.stderr


class _Writes(io.StringIO):
    """A target that remembers what each flush pushed out (one write to the pipe)."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []
        self._mark = 0

    def flush(self) -> None:
        value = self.getvalue()
        if len(value) > self._mark:
            self.flushed.append(value[self._mark :])
            self._mark = len(value)


def test_a_long_line_reaches_the_pipe_in_prefixed_pieces_that_cannot_interleave() -> None:
    target = _Writes()
    stream = PrefixedStream(target, "[rank 3] ")
    line = "é" * 3000 + "x" * 20000
    stream.write(line + "\nshort\n")
    assert all(len(piece.encode()) <= PIPE_BUF for piece in target.flushed)
    assert all(piece.startswith("[rank 3] ") and piece.endswith("\n") for piece in target.flushed)
    text = [piece.removeprefix("[rank 3] ").removesuffix("\n") for piece in target.flushed]
    assert "".join(text[:-2]) == line[:MAX_LINE_CHARS]
    assert text[-2:] == [
        f"(the line went on for {len(line) - MAX_LINE_CHARS} more characters)",
        "short",
    ]


def test_every_piece_of_ranks_long_lines_on_one_pipe_keeps_its_rank() -> None:
    """Two ranks printing long lines into one pipe, read by the worker's pump: every line
    stored has its rank (a line longer than PIPE_BUF written at once was split by the kernel,
    and its rest, after another rank's line, had none)."""
    from ace3_worker.launch import _pump
    from ace3_worker.log_limits import LogLimiter

    code = (
        "import sys\n"
        "from ace3.runtime.process.log_prefix import install_log_prefix\n"
        "install_log_prefix(int(sys.argv[1]))\n"
        "for n in range(40):\n"
        "    print(sys.argv[1] * 70000)\n"
    )
    read_fd, write_fd = os.pipe()
    writers = [
        subprocess.Popen([sys.executable, "-c", code, str(rank)], stdout=write_fd)
        for rank in (1, 2)
    ]
    os.close(write_fd)
    lines: queue.Queue[LogLine] = queue.Queue()
    limiter = LogLimiter(1e9, 1e12, 1 << 40)
    with os.fdopen(read_fd, "rb") as pipe:
        _pump(pipe, "stdout", lines, limiter, threading.Event())
    assert [writer.wait(60) for writer in writers] == [0, 0]
    stored = list(lines.queue)
    assert len(stored) >= 2 * 40 * 3
    assert all(line.rank is not None for line in stored), [
        line.line[:40] for line in stored if line.rank is None
    ][:5]
    assert all(set(line.line) == {str(line.rank)} for line in stored if "went on" not in line.line)
