"""Per-rank log prefixing of stdout and stderr."""

from __future__ import annotations

import io
import subprocess
import sys

from ace3.runtime.process.log_prefix import PrefixedStream


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
