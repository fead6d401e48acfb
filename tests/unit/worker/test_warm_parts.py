"""The warm path's small parts: the launcher's control messages (typed, bounded), which slots
prepare sandboxes, the cold path's reasons, the GPUs a claim keeps for a prepared sandbox, and
the code fingerprint that retires a launcher older than the code on disk."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from ace3.config import warm_launch
from ace3.config.warm_launch import (
    MAX_MESSAGE_BYTES,
    LauncherReady,
    LauncherStarted,
    WarmJob,
    parse_job,
    parse_ready,
    parse_started,
    read_line,
    send_message,
)
from ace3_control.settings import Settings
from ace3_worker import warm_sandbox
from ace3_worker.gpu_sets import DeviceAllocator
from ace3_worker.launch import LaunchSpec
from ace3_worker.launcher import torchrun_command, warm_torchrun_args
from ace3_worker.warm import WarmSlot, _share


def test_messages_travel_as_one_line_each_and_come_back_typed() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        send_message(theirs, LauncherStarted())
        send_message(theirs, LauncherReady(seconds=2.5))
        job = WarmJob(argv=["--standalone", "--job", "/job/job.json"], env={"A": "1", "B": ""})
        send_message(ours, job)
        assert parse_started(read_line(ours)) == LauncherStarted()
        assert parse_ready(read_line(ours)).seconds == 2.5
        assert parse_job(read_line(theirs)) == job
        theirs.close()
        assert read_line(ours) == b"", "the other side closed: no line"


def test_the_launchers_first_line_is_a_started_message() -> None:
    from ace3.runtime.process.warm_launcher import STARTED_LINE

    assert STARTED_LINE.endswith(b"\n")
    assert parse_started(STARTED_LINE[:-1]) == LauncherStarted()


@pytest.mark.parametrize(
    "line",
    [
        b'{"type": "job", "argv": [], "env": {"A=B": "x"}}',  # (a name with "=")
        b'{"type": "job", "argv": [], "env": {}, "extra": 1}',
        b'{"type": "ready", "seconds": -1}',
        b"not json",
    ],
)
def test_a_malformed_message_is_refused(line: bytes) -> None:
    parse = parse_job if b'"job"' in line else parse_ready
    with pytest.raises(ValidationError):
        parse(line)


def test_a_line_past_the_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm_launch, "MAX_MESSAGE_BYTES", 1000)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b"x" * 2000)
        with pytest.raises(ValueError, match="longer than 1000 bytes"):
            read_line(ours)
    assert MAX_MESSAGE_BYTES == 1 << 20


def test_warm_arguments_are_the_cold_commands_options_with_a_forked_rank_entry() -> None:
    cold = torchrun_command("/job/job.json", 2, 65)
    warm_args = warm_torchrun_args("/job/job.json", 2, 65)
    options = cold[2 : cold.index("-m")]  # (after the interpreter and torchrun's path)
    assert warm_args[: len(options)] == options
    run_path = warm_args[len(options) :]
    assert run_path[:2] == ["--run-path", "--start-method=forkserver"]
    assert Path(run_path[2]).name == "warm_rank.py" and Path(run_path[2]).is_file()
    assert run_path[3:] == ["--job", "/job/job.json"]


def _slot(tmp_path: Path, **settings: Any) -> WarmSlot:
    values = Settings(data_dir=tmp_path, sandbox="none", worker_device="cpu", **settings)
    workspace = SimpleNamespace(plan=SimpleNamespace(visible_root=None), lease_identity=None)
    return WarmSlot(values, workspace, None, None, settings.pop("keeps", True))  # type: ignore[arg-type]


def test_only_a_long_lived_slot_with_warm_launch_on_prepares_a_sandbox(tmp_path: Path) -> None:
    spec = LaunchSpec(torchrun_command("/j", 1), warm_args=warm_torchrun_args("/j", 1))
    off = WarmSlot(Settings(data_dir=tmp_path, warm_launch=False), None, None, None)  # type: ignore[arg-type]
    off.prepare()  # (would need a workspace to lease a uid: it never gets there)
    assert off.prepared is None
    assert off._cold_reason(None, spec, {}) == "warm launch is off (ACE3_WARM_LAUNCH=false)"
    one_job = WarmSlot(Settings(data_dir=tmp_path), None, None, None, keeps_sandboxes=False)  # type: ignore[arg-type]
    one_job.prepare()
    assert one_job.prepared is None
    assert one_job._cold_reason(None, spec, {}).startswith("this supervisor runs one job")
    slot = WarmSlot(Settings(data_dir=tmp_path), None, None, None)  # type: ignore[arg-type]
    multi_node = LaunchSpec(["torchrun"], share_network=True)
    assert "multi-node" in str(slot._cold_reason(None, multi_node, {}))
    assert slot._cold_reason(None, spec, {}) == (
        "no sandbox was prepared yet (this slot's first job)"
    )


def test_a_cuda_slot_prepares_its_share_of_the_gpus_and_a_claim_keeps_them(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path, worker_slots=2, worker_device="cuda")
    slot = WarmSlot(settings, None, None, ("0", "1", "2", "3"))  # type: ignore[arg-type]
    assert slot.visible_devices == "0,1"
    prepared = SimpleNamespace(env={"CUDA_VISIBLE_DEVICES": "2,3"}, problem=None)
    assert slot.preferred_devices(prepared) == ("2", "3")  # type: ignore[arg-type]
    spec = LaunchSpec(torchrun_command("/j", 2), warm_args=warm_torchrun_args("/j", 2))
    other = {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert slot._cold_reason(prepared, spec, other) == (  # type: ignore[arg-type]
        "its GPUs (0,1) are not the ones the prepared sandbox binds (2,3)"
    )
    allocator = DeviceAllocator(("0", "1", "2", "3"), tmp_path / "locks")
    with allocator.reserving_free() as free:
        free.keep(2, prefer=("2", "3"))
    assert free.devices == ("2", "3")
    free.release()
    with allocator.reserving_free() as free:
        free.keep(1, prefer=("2", "3"))  # (another count: the first free ones)
    assert free.devices == ("0",)
    free.release()


def test_the_fingerprint_changes_when_the_code_on_disk_does(tmp_path: Path) -> None:
    before = warm_sandbox.code_fingerprint()
    assert before == warm_sandbox.code_fingerprint()
    source = Path(warm_launch.__file__)
    stat = source.stat()
    try:
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        assert warm_sandbox.code_fingerprint() != before
    finally:
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert warm_sandbox.code_fingerprint() == before
    assert time.monotonic() > 0


def test_each_slot_starts_with_its_own_share_of_the_gpus() -> None:
    pool = ("0", "1", "2", "3")
    assert [_share(pool, slot, 2) for slot in (0, 1, 2)] == ["0,1", "2,3", "0,1"]
    assert _share(pool, 0, 1) == "0,1,2,3"
    assert [_share(pool, slot, 3) for slot in (0, 1, 2, 3)] == ["0", "1", "2", "3"]
    assert _share(("0",), 1, 4) == "0"


def test_a_service_path_that_appears_under_the_python_retires_a_prepared_sandbox(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    plan = SimpleNamespace(
        runtime_paths=(venv,), hidden=(venv / "data", venv / "ace3.db-wal", tmp_path / "store")
    )
    (tmp_path / "store").mkdir()  # (not under anything a sandbox binds: never in its view)
    before = warm_sandbox.hidden_paths_present(plan)  # type: ignore[arg-type]
    assert before == frozenset()
    (venv / "ace3.db-wal").write_text("")
    after = warm_sandbox.hidden_paths_present(plan)  # type: ignore[arg-type]
    assert after == {venv / "ace3.db-wal"}
    prepared = SimpleNamespace(
        process=SimpleNamespace(poll=lambda: None), fingerprint="f", hidden=before
    )
    reason = warm_sandbox.WarmSandbox.unusable(prepared, "f", after)  # type: ignore[arg-type]
    assert reason is not None and "ace3.db-wal" in reason
    assert warm_sandbox.WarmSandbox.unusable(prepared, "f", before) is None  # type: ignore[arg-type]


def test_the_sweep_removes_only_skeletons_nobody_holds(tmp_path: Path) -> None:
    from ace3_worker.held_dirs import lock_if_unheld

    slot = WarmSlot(Settings(data_dir=tmp_path), None, None, None)  # type: ignore[arg-type]
    slot.root.mkdir(parents=True)
    (slot.root / "dead").mkdir()
    (slot.root / "dead" / "etc").mkdir()
    (slot.root / "live").mkdir()
    held = lock_if_unheld(slot.root / "live")
    assert held is not None
    try:
        slot._sweep()
        assert sorted(p.name for p in slot.root.iterdir()) == ["live"]
    finally:
        os.close(held)


def test_a_skeleton_another_workers_sweep_removed_before_its_lock_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh-clone run failed so ("No such file or directory: .../jobs/.warm/<pid>-<hex> ->
    .../attempt-2-node-0"): a worker process starting up swept a skeleton another had made but
    not yet locked, and that one's sandbox then held a removed directory."""
    import ace3_worker.warm as warm_module

    settings = Settings(data_dir=tmp_path)
    starting = WarmSlot(settings, None, None, None)  # type: ignore[arg-type]  # (another process's)
    workspace = SimpleNamespace(
        lease_identity=lambda: None, plan=SimpleNamespace(visible_root=None)
    )
    slot = WarmSlot(settings, workspace, None, None)  # type: ignore[arg-type]
    made: list[Path] = []
    real_mkdir = Path.mkdir

    def mkdir_then_swept(self: Path, *args: Any, **kwargs: Any) -> None:
        real_mkdir(self, *args, **kwargs)
        if self.parent == slot.root and not made:
            made.append(self)
            starting._sweep()

    launched: list[Path] = []

    def launch(plan: Any, directory: Any, *args: Any, **kwargs: Any) -> SimpleNamespace:
        launched.append(directory.root)
        return SimpleNamespace()

    monkeypatch.setattr(Path, "mkdir", mkdir_then_swept)
    monkeypatch.setattr(warm_module, "launch", launch)
    monkeypatch.setattr(warm_module, "hidden_paths_present", lambda plan: frozenset())
    sandbox = slot._start()
    try:
        assert made and not made[0].exists()  # (the sweep did remove the first one)
        assert launched == [sandbox.directory.root] and sandbox.directory.root != made[0]
        assert (sandbox.directory.root / "etc").is_dir()
        held, there = os.fstat(sandbox.directory_lock), os.stat(sandbox.directory.root)
        assert (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
        starting._swept = False
        starting._sweep()  # (a held skeleton is never swept)
        assert sandbox.directory.root.is_dir()
    finally:
        os.close(sandbox.directory_lock)
        sandbox.control.close()
