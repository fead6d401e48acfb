"""Single-node torchrun runs for the engine's tests, started the way a worker's warm sandbox
starts them: through a launcher (:mod:`ace3.runtime.process.warm_launcher`, here outside any sandbox)
that imported torch, torchrun's agent and the engine before the run was known, whose ranks are
its forks. The next run's launcher imports while the current one trains, so a test pays
neither torchrun's import of torch nor each rank's (a 4-rank run spent most of its time there).

``run(job_file, nproc, env)`` returns what ``subprocess.run([torchrun ...], capture_output=True,
text=True)`` returns; the output, exit status and torchrun's error summary are torchrun's own.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import threading
from dataclasses import dataclass

from ace3.config.warm_launch import WarmJob, parse_started, read_line, send_message
from ace3.runtime.process.warm_launcher import COMMAND, WARM_RANK_ARGS

# What changes from test to test in pytest's environment and means nothing to a run.
VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})


@dataclass
class _Launcher:
    process: subprocess.Popen[str]
    control: socket.socket
    env: dict[str, str]


class WarmRuns:
    """One spare launcher at a time, for the environment the last run asked for."""

    def __init__(self) -> None:
        self._spare: _Launcher | None = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    def _start(self, env: dict[str, str]) -> _Launcher:
        ours, theirs = socket.socketpair()
        with theirs:
            process = subprocess.Popen(
                [*COMMAND, "--control-fd", str(theirs.fileno())],
                # (faulthandler: a run that hangs is aborted with every thread's traceback)
                env={**env, "PYTHONFAULTHANDLER": "1"},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        return _Launcher(process, ours, env)

    def _take(self, env: dict[str, str]) -> _Launcher:
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and (spare.env != env or spare.process.poll() is not None):
            self._stop(spare)
            spare = None
        return spare if spare is not None else self._start(env)

    def run(
        self, job_file: str, nproc: int, env: dict[str, str], timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``torchrun --standalone --nproc-per-node nproc`` of the engine on ``job_file``; a
        run that does not end within ``timeout`` fails the test with every process's stacks.
        (Ranks forked from torchrun's agent used to hang now and then in ``TCPStore``'s
        constructor; they are forks of the launcher's one-thread zygote now:
        :mod:`ace3.runtime.process.rank_zygote`.)"""
        outcome = self._run_once(job_file, nproc, env, timeout)
        if isinstance(outcome, str):
            raise AssertionError(
                f"the run did not end in {timeout:g} s; where each process was:\n{outcome}"
            )
        return outcome

    def _run_once(
        self, job_file: str, nproc: int, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str] | str:
        """The run's result, or where each of its processes was when it timed out."""
        env = {key: value for key, value in env.items() if key not in VOLATILE}
        launcher = self._take(env)
        parse_started(read_line(launcher.control))
        argv = ["--standalone", "--nnodes=1", f"--nproc-per-node={nproc}", "--max-restarts=0",
                "--monitor-interval=0.02", *WARM_RANK_ARGS, "--job", job_file]  # fmt: skip
        send_message(launcher.control, WarmJob(argv=argv, env=env))
        with self._lock:
            if self._spare is None:
                self._spare = self._start(env)  # (the next run's, while this one trains)
        try:
            stdout, stderr = launcher.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return self._abort(launcher)
        finally:
            self._stop(launcher)
        return subprocess.CompletedProcess(
            [*COMMAND, *argv], launcher.process.returncode, stdout, stderr
        )

    @staticmethod
    def _abort(launcher: _Launcher) -> str:
        """SIGABRT to the launcher and its ranks: faulthandler prints each one's stacks; and
        what else used the machine's CPU meanwhile (a process another test left running)."""
        busiest = subprocess.run(
            ["ps", "-eo", "pid,pcpu,etime,args", "--sort=-pcpu"], capture_output=True, text=True
        ).stdout.splitlines()[:15]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.process.pid, signal.SIGABRT)
        try:
            stdout, stderr = launcher.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            stdout, stderr = "", "(no output within 30 s of SIGABRT)"
        return "\n".join(["the busiest processes:", *busiest, stdout, stderr])

    @staticmethod
    def _stop(launcher: _Launcher) -> None:
        launcher.control.close()
        if launcher.process.poll() is None:
            os.killpg(launcher.process.pid, 9)
            launcher.process.communicate()

    def close(self) -> None:
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            self._stop(spare)


WARM_RUNS = WarmRuns()
