"""What a job writes is untrusted: files are opened without following links, every events record
is validated and bounded, and checkpoint records may only name the attempt's own checkpoints."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path, PurePosixPath

import pytest

from ace3.config.events import (
    CheckpointRecord,
    MetricsRecord,
    RefusedRecord,
    StartRecord,
    parse_record,
)
from ace3_control.storage import LocalArtifactStore
from ace3_worker import checkpoints, reports
from ace3_worker.job_files import UnsafeJobPathError, open_job_file

CHECKPOINTS = PurePosixPath("/job/output/checkpoints")


def test_a_regular_file_inside_opens(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"data")
    fd = open_job_file(tmp_path, "a/f")
    with os.fdopen(fd, "rb") as handle:
        assert handle.read() == b"data"


@pytest.mark.parametrize("relative", ["../x", "a/../../x", "/etc/passwd", "a\0b", ""])
def test_paths_that_leave_the_directory_are_refused(tmp_path: Path, relative: str) -> None:
    with pytest.raises(UnsafeJobPathError):
        open_job_file(tmp_path, relative)


def test_links_are_never_followed_at_any_depth(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("secret")
    root = tmp_path / "job"
    root.mkdir()
    (root / "file-link").symlink_to(outside / "secret")
    (root / "dir-link").symlink_to(outside)
    with pytest.raises(UnsafeJobPathError):
        open_job_file(root, "file-link")
    with pytest.raises(UnsafeJobPathError):
        open_job_file(root, "dir-link/secret")


def test_fifos_devices_and_hard_links_are_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafeJobPathError):
        open_job_file(tmp_path, "fifo")  # (opened non-blocking: a FIFO never hangs the worker)
    (tmp_path / "original").write_text("x")
    os.link(tmp_path / "original", tmp_path / "alias")
    with pytest.raises(UnsafeJobPathError):
        open_job_file(tmp_path, "alias")


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"not json", "not JSON"),
        (b'{"type": "metrics", "step": NaN, "values": {}}', "not JSON"),
        (b'{"type": "metrics", "step": 99999999999, "values": {}}', "step"),
        (b'{"type": "metrics", "step": -1, "values": {}}', "step"),
        (b'{"type": "metrics", "step": "1", "values": {}}', "step"),
        (b'{"type": "metrics", "step": 1, "values": {"a\\u0000b": 1.0}}', "values"),
        (b'{"type": "metrics", "step": 1, "values": {"loss": 1e999}}', "values"),
        (b'{"type": "metrics", "step": 1, "values": {}, "extra": 1}', "extra"),
        (b'{"type": "checkpoint", "step": 1, "name": "x", "path": "/x"}', "sha256"),
        (b'{"type": "launch_missiles"}', "type"),
        (b"[" * 10_000 + b"]" * 10_000, ""),
    ],
)
def test_bad_records_are_refused_with_a_reason(line: bytes, reason: str) -> None:
    record = parse_record(line)
    assert isinstance(record, RefusedRecord)
    assert reason in record.reason


def test_many_metrics_and_long_lines_are_refused() -> None:
    values = {f"m{index}": 1.0 for index in range(1000)}
    assert isinstance(
        parse_record(json.dumps({"type": "metrics", "step": 1, "values": values}).encode()),
        RefusedRecord,
    )
    assert isinstance(parse_record(b'{"type": "metrics"' + b" " * 300_000 + b"}"), RefusedRecord)


def test_the_engine_s_records_are_accepted() -> None:
    record = parse_record(
        b'{"type":"metrics","step":3,"epoch":1,"values":{"train_loss":0.5,"val_loss":null}}'
    )
    assert record == MetricsRecord(
        type="metrics", step=3, epoch=1, values={"train_loss": 0.5, "val_loss": None}
    )


def test_an_endless_line_is_refused_once_and_skipped_to_its_end(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    tail = reports.EventTail(tmp_path, max_bytes_per_read=64 * 1024)
    with events.open("wb") as handle:
        handle.write(b'{"type": "start", "total_steps": 3}\n' + b"x" * 600_000)
    first: list[object] = []
    while not first or tail.has_more:
        first += tail.read_new()
    with events.open("ab") as handle:
        handle.write(b'xx\n{"type": "start", "total_steps": 2}\n')
    rest = tail.read_new()
    assert first[0] == StartRecord(type="start", total_steps=3)
    assert [type(item) for item in first[1:]] == [RefusedRecord]
    assert rest == [StartRecord(type="start", total_steps=2)]


def test_an_events_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text('{"type": "start", "total_steps": 1}\n')
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / "events.jsonl").symlink_to(tmp_path / "secret")
    tail = reports.EventTail(tmp_path / "output")
    (refused,) = tail.read_new()
    assert isinstance(refused, RefusedRecord) and "cannot be read" in refused.reason
    assert tail.read_new() == [], "said once"


def _record(name: str, step: int, path: str | None = None, data: bytes = b"w") -> CheckpointRecord:
    return CheckpointRecord(
        type="checkpoint",
        step=step,
        name=name,
        path=path or str(CHECKPOINTS / name),
        sha256=hashlib.sha256(data).hexdigest(),
        size_bytes=len(data),
    )


PLAN = StartRecord(type="start", total_steps=10)


@pytest.mark.parametrize(
    ("record", "plan", "problem"),
    [
        (_record("step-00000004.pt", 4), PLAN, None),
        (_record("step-00000004.dcp.tar", 4), PLAN, None),
        (_record("step-00000004.pt", 4, "/etc/passwd"), PLAN, "is not /job/output/checkpoints"),
        (_record("step-00000004.pt", 4, "/job/output/checkpoints/../x"), PLAN, "is not"),
        (_record("step-00000004.pt", 5), PLAN, "claims step 5"),
        (_record("model.pt", 4), PLAN, "is not step-<step>.pt"),
        (_record("step-00000011.pt", 11), PLAN, "beyond the 10 steps"),
        (_record("step-00000004.pt", 4), None, "before the run's start record"),
    ],
)
def test_checkpoint_records_name_only_the_attempt_s_own_checkpoints(
    record: CheckpointRecord, plan: StartRecord | None, problem: str | None
) -> None:
    found = checkpoints.checkpoint_problem(record, CHECKPOINTS, plan)
    assert (found is None) if problem is None else (problem in (found or ""))


def test_staging_copies_a_verified_checkpoint_and_never_deletes_the_job_s_file(
    tmp_path: Path,
) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    output = tmp_path / "output"
    (output / "checkpoints").mkdir(parents=True)
    (output / "checkpoints" / "step-00000004.pt").write_bytes(b"weights")
    staged = checkpoints.stage_checkpoint(
        store, "job", _record("step-00000004.pt", 4, data=b"weights"), output, 1 << 20
    )
    assert isinstance(staged, checkpoints.StagedCheckpoint)
    assert store.open(staged.storage_key).read() == b"weights"
    assert (output / "checkpoints" / "step-00000004.pt").exists()

    (output / "checkpoints" / "step-00000005.pt").write_bytes(b"other")
    mismatch = checkpoints.stage_checkpoint(
        store, "job", _record("step-00000005.pt", 5, data=b"claim"), output, 1 << 20
    )
    assert isinstance(mismatch, str) and "failed verification" in mismatch
    assert not [
        key for key in (store.root / "checkpoints" / "job").iterdir() if "step-00000005" in key.name
    ]
    too_big = checkpoints.stage_checkpoint(
        store, "job", _record("step-00000004.pt", 4, data=b"weights"), output, 3
    )
    assert isinstance(too_big, str) and "ACE3_MAX_CHECKPOINT_BYTES" in too_big


def test_log_lines_are_bounded_and_storable() -> None:
    line = reports.parse_log_line("stdout", "[rank 99999999999] a\0b\n")
    assert line.rank is None and "\0" not in line.line
    assert reports.parse_log_line("stdout", "[rank 3] x\n").rank == 3


def test_an_events_file_is_read_up_to_its_cap_and_no_further(tmp_path: Path) -> None:
    line = b'{"type": "start", "total_steps": 3}\n'
    (tmp_path / "events.jsonl").write_bytes(line * 100)
    tail = reports.EventTail(
        tmp_path, max_bytes_per_read=len(line) * 7, max_total_bytes=len(line) * 10
    )
    records: list[object] = []
    for _ in range(20):
        records += tail.read_new()
    assert records[:10] == [StartRecord(type="start", total_steps=3)] * 10
    (refused,) = records[10:]
    assert isinstance(refused, RefusedRecord) and "the rest is ignored" in refused.reason
    assert not tail.has_more, "a final pass ends"
