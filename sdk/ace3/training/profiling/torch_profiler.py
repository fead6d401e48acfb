"""``ace3.TrainingProfiler``: torch.profiler around training, local or remote.

::

    profiler = ace3.TrainingProfiler(
        activities=[ace3.ProfilerActivity.CPU, ace3.ProfilerActivity.CUDA],
        record_shapes=True, profile_memory=True,
    )
    with profiler:
        trainer.train(model, dataset)
    print(profiler.key_averages().table(sort_by="cuda_time_total"))
    profiler.export_chrome_trace("training_trace.json")

In-process code inside the block (a local trainer, your own loop) runs under a real
``torch.profiler.profile``. A trainer that submits a job while the profiler is active puts
:meth:`TrainingProfiler.remote_spec` into the job's config; the job's rank 0 records the steps
the schedule picks, and the trainer hands the results back with :meth:`load_remote`. When a
block holds both, the remote results are what :meth:`key_averages` and
:meth:`export_chrome_trace` return (the local profile of a remote run only shows this process
waiting); ``source="local"`` asks for the local one, ``source=<job id>`` for one job.

No torch import at module level: remote-only use needs torch only to build the table.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ace3.config.specs import ARTIFACT_SCHEME, ProfilerSpec
from ace3.training.profiling.profiler_options import (
    ProfilerActivity,
    check_activity,
    check_flag,
    check_schedule,
)
from ace3.training.profiling.registry import ProfilingError, active_profilers, register, unregister

# Only one in-process torch profiler can run at a time.
_local_lock = threading.Lock()
_local_owner: TrainingProfiler | None = None


@dataclass
class RemoteProfile:
    """One job's profiler results, copied into the profiler's own temporary directory."""

    job_id: str
    directory: Path
    body: dict[str, Any]

    @property
    def trace(self) -> Path | None:
        path = self.directory / "trace.json"
        return path if path.is_file() else None


class TrainingProfiler:
    """Profile training with torch.profiler (see the module docstring).

    ``activities``: ``ProfilerActivity`` values (default CPU, plus CUDA when this machine has
    it); CUDA on a machine without it is dropped with one warning. ``record_shapes``,
    ``profile_memory``, ``with_stack``, ``with_flops``: as in ``torch.profiler.profile``.
    ``schedule_steps``: ``(wait, warmup, active)`` optimizer steps. Remote jobs always record
    such a window on rank 0 (default ``(1, 1, 20)``: a trace of a whole job would be huge).
    In-process, ``None`` records the whole block; a tuple applies torch's schedule, which
    advances on :meth:`step` (ACE3's local trainer calls it after every optimizer step).
    """

    def __init__(
        self,
        activities: list[Any] | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        schedule_steps: tuple[int, int, int] | None = None,
    ) -> None:
        if activities is not None and not isinstance(activities, (list, tuple, set)):
            raise TypeError(
                f"activities must be a list of ace3.ProfilerActivity, got {type(activities).__name__}"
            )
        if activities is not None and not activities:
            raise ValueError("activities is empty; pass ProfilerActivity.CPU (and/or CUDA) or None")
        self.activities: list[ProfilerActivity] | None = (
            None
            if activities is None
            else list(dict.fromkeys(check_activity(a) for a in activities))
        )
        self.record_shapes = check_flag("record_shapes", record_shapes)
        self.profile_memory = check_flag("profile_memory", profile_memory)
        self.with_stack = check_flag("with_stack", with_stack)
        self.with_flops = check_flag("with_flops", with_flops)
        self.schedule_steps = check_schedule(schedule_steps)
        self._prof: Any = None  # the running (then finished) local torch profiler
        self._local_done = False
        self._local_note: str | None = None
        self._remote: dict[str, RemoteProfile] = {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._active = False

    # -- the with block -------------------------------------------------------------------
    def __enter__(self) -> TrainingProfiler:
        register(self)
        self._active = True
        self._remote = {}  # a new block starts fresh
        try:
            self._start_local()
        except BaseException:
            self._active = False
            unregister(self)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._stop_local()
        finally:
            self._active = False
            unregister(self)

    @property
    def active(self) -> bool:
        return self._active

    def _torch_activities(self) -> list[Any]:
        import torch
        from torch.profiler import ProfilerActivity as TorchActivity

        cuda = torch.cuda.is_available()
        if self.activities is None:
            return [TorchActivity.CPU] + ([TorchActivity.CUDA] if cuda else [])
        chosen = []
        for activity in self.activities:
            if activity is ProfilerActivity.CUDA and not cuda:
                warnings.warn(
                    "ace3.TrainingProfiler: ProfilerActivity.CUDA was requested but this "
                    "machine has no CUDA device; profiling in-process code on the CPU only "
                    "(remote jobs on GPUs still record CUDA)",
                    UserWarning,
                    stacklevel=4,
                )
                continue
            chosen.append(activity.to_torch())
        return chosen or [TorchActivity.CPU]

    def _start_local(self) -> None:
        global _local_owner
        self._prof, self._local_done, self._local_note = None, False, None
        if importlib.util.find_spec("torch") is None:
            self._local_note = "torch is not installed here, so in-process code was not profiled"
            return
        import torch

        with _local_lock:
            if _local_owner is not None:
                self._local_note = (
                    "another ace3.TrainingProfiler was already profiling this process; "
                    "this one records remote jobs only"
                )
                warnings.warn(f"ace3.TrainingProfiler: {self._local_note}", UserWarning, 3)
                return
            _local_owner = self
        try:
            schedule = None
            if self.schedule_steps is not None:
                wait, warmup, active = self.schedule_steps
                schedule = torch.profiler.schedule(
                    wait=wait, warmup=warmup, active=active, repeat=1
                )
            prof = torch.profiler.profile(
                activities=self._torch_activities(),
                schedule=schedule,
                record_shapes=self.record_shapes,
                profile_memory=self.profile_memory,
                with_stack=self.with_stack,
                with_flops=self.with_flops,
            )
            prof.start()
            self._prof = prof
        except BaseException:
            with _local_lock:
                _local_owner = None
            raise

    def _stop_local(self) -> None:
        global _local_owner
        prof = self._prof
        if prof is None:
            return
        try:
            prof.stop()
        finally:
            with _local_lock:
                if _local_owner is self:
                    _local_owner = None
            self._local_done = True

    def step(self) -> None:
        """Mark the end of one optimizer step: advances the in-process schedule (without
        ``schedule_steps`` it only adds a ``ProfilerStep#N`` span per step to the results).
        A no-op outside the block."""
        if self._prof is not None and not self._local_done:
            self._prof.step()

    # -- remote jobs ----------------------------------------------------------------------
    def remote_spec(self, output_dir: str = ARTIFACT_SCHEME + "profiler") -> ProfilerSpec:
        """The job-config profiler spec for these settings (CUDA kept: the job's GPUs decide)."""
        wait, warmup, active = self.schedule_steps or (1, 1, 20)
        activities = self.activities or [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        return ProfilerSpec(
            activities=[a.value for a in activities],
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            wait=wait,
            warmup=warmup,
            active=active,
            output_dir=output_dir,
        )

    def load_remote(self, directory: str | Path, job_id: str) -> None:
        """Take a finished job's profiler directory (``trace.json``, ``key_averages.json``).

        The files are copied, so ``directory`` may be deleted afterwards. Raises
        ``FileNotFoundError``/``ValueError`` when the directory does not hold valid results.
        """
        from ace3.runtime.observe.profile_events import (
            KEY_AVERAGES_FILE,
            TRACE_FILE,
            read_key_averages,
        )

        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"job_id must be a non-empty string, got {job_id!r}")
        source = Path(directory)
        if not source.is_dir():
            raise FileNotFoundError(f"directory {source} does not exist or is not a directory")
        body = read_key_averages(source / KEY_AVERAGES_FILE)
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ace3-profile-")
        target = Path(self._tmp.name) / f"job-{len(self._remote)}"
        target.mkdir()
        shutil.copy2(source / KEY_AVERAGES_FILE, target / KEY_AVERAGES_FILE)
        if (source / TRACE_FILE).is_file():
            shutil.copy2(source / TRACE_FILE, target / TRACE_FILE)
        self._remote.pop(job_id, None)  # a re-delivered job becomes the latest
        self._remote[job_id] = RemoteProfile(job_id, target, body)

    @property
    def job_ids(self) -> list[str]:
        """The remote jobs whose results were loaded, oldest first."""
        return list(self._remote)

    # -- results --------------------------------------------------------------------------
    def _pick(self, source: str | None) -> RemoteProfile | None:
        """The remote profile ``source`` names (None: the latest), or None for the local one."""
        if source == "local":
            return None
        if source is not None:
            if source not in self._remote:
                raise ProfilingError(
                    f"source {source!r}: no results for that job; loaded jobs: "
                    f"{self.job_ids or 'none'} (or 'local')"
                )
            return self._remote[source]
        if self._remote:
            return self._remote[next(reversed(self._remote))]
        return None

    def _local_profile(self) -> Any:
        if self._active and self._prof is not None:
            raise ProfilingError(
                "the profiler is still running: read results after the with-block ends"
            )
        if self._prof is None or not self._local_done:
            why = f" ({self._local_note})" if self._local_note else ""
            raise ProfilingError(
                "nothing was profiled yet: run training inside `with profiler:` first" + why
            )
        if getattr(self._prof, "profiler", None) is None:
            wait, warmup, active = self.schedule_steps or (0, 0, 0)
            raise ProfilingError(
                f"nothing was recorded in-process: the schedule's window (steps "
                f"{wait + warmup + 1}-{wait + warmup + active}) was never reached; call "
                "profiler.step() after each optimizer step, or use schedule_steps=None"
            )
        if not self._prof.events():
            raise ProfilingError(
                "nothing was profiled: no torch operator ran inside the with-block (a remote "
                "job's results arrive through its trainer)"
            )
        return self._prof

    def key_averages(self, group_by_input_shape: bool = False, source: str | None = None) -> Any:
        """Per-operator totals as a torch ``EventList`` (``.table(sort_by=..., row_limit=...)``).

        ``source``: None (the latest remote job, else the local profile), ``"local"``, or a
        job id. ``group_by_input_shape`` needs ``record_shapes=True``.
        """
        remote = self._pick(source)
        if remote is None:
            return self._local_profile().key_averages(group_by_input_shape=group_by_input_shape)
        from ace3.runtime.observe.profile_events import rebuild_event_list

        body, meta = remote.body, remote.body["meta"]
        records = body["events_by_input_shape"] if group_by_input_shape else body["events"]
        if records is None and body["events"] is not None:
            raise ProfilingError(
                f"job {remote.job_id} did not record input shapes; profile with "
                "record_shapes=True to group by input shape"
            )
        if records is None:
            note = meta.get("note") or "the job recorded no profiler events"
            raise ProfilingError(f"job {remote.job_id}: {note}")
        return rebuild_event_list(
            records,
            use_device=meta.get("use_device"),
            profile_memory=bool(meta.get("profile_memory")),
            with_flops=bool(meta.get("with_flops")),
        )

    def export_chrome_trace(self, path: str | Path, source: str | None = None) -> Path:
        """Write the Chrome trace (open it in ``chrome://tracing`` or ui.perfetto.dev);
        ``source`` as in :meth:`key_averages`. Returns the path written."""
        target = Path(path)
        if not target.parent.exists():
            raise FileNotFoundError(f"path: the directory {target.parent} does not exist")
        remote = self._pick(source)
        if remote is None:
            self._local_profile().export_chrome_trace(str(target))
            return target
        if remote.trace is None:
            note = remote.body["meta"].get("note") or "the job wrote no trace"
            raise ProfilingError(f"job {remote.job_id}: {note}")
        shutil.copyfile(remote.trace, target)
        return target


def in_process_profiler_running() -> bool:
    """True while some :class:`TrainingProfiler` runs a torch profiler in this process (a second
    torch profiler would silently break it)."""
    with _local_lock:
        return _local_owner is not None


def active_training_profilers() -> list[TrainingProfiler]:
    """The active :class:`TrainingProfiler` objects, outermost first."""
    return [p for p in active_profilers() if isinstance(p, TrainingProfiler)]


def combined_remote_spec(profilers: list[TrainingProfiler]) -> ProfilerSpec | None:
    """One job spec for several active profilers (nested blocks): the union of their
    activities and options, the innermost one's schedule. None for an empty list."""
    if not profilers:
        return None
    specs = [p.remote_spec() for p in profilers]
    inner = specs[-1]
    return inner.model_copy(
        update={
            "activities": list(dict.fromkeys(a for s in specs for a in s.activities)),
            "record_shapes": any(s.record_shapes for s in specs),
            "profile_memory": any(s.profile_memory for s in specs),
            "with_stack": any(s.with_stack for s in specs),
            "with_flops": any(s.with_flops for s in specs),
        }
    )
