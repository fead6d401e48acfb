"""The readers' request files are a job's writes: a symbolic link, a FIFO, a hard link, a huge
file, bad JSON, unknown shard names or a wrong file name are each ignored and reported once;
a request directory replaced by a link is not read at all."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ace3.config.shards import REQUEST_DIR, REQUEST_MAX_BYTES
from ace3_worker import shard_requests
from ace3_worker.shard_feed import priority
from ace3_worker.shard_requests import Request, RequestReader

KNOWN = {"train": {"000000.bin", "000001.bin", "000002.bin"}, "validation": {"000000.bin"}}


def reader(tmp_path: Path) -> tuple[RequestReader, Path, list[str]]:
    output = tmp_path / "output"
    (output / REQUEST_DIR).mkdir(parents=True)
    said: list[str] = []
    return RequestReader(output, KNOWN, said.append), output / REQUEST_DIR, said


def test_valid_requests_are_read_bad_ones_ignored_and_reported_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shard_requests, "REREAD_SECONDS", 0.0)
    requests, directory, said = reader(tmp_path)
    (directory / "train-r0-w0.json").write_text(json.dumps({"need": ["000001.bin", "000002.bin"]}))
    (directory / "validation-r1-w0.json").write_text(json.dumps({"need": ["000000.bin"]}))
    (directory / ".train-r0-w0.json.tmp").write_text("half written")  # silently skipped
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"need": ["000000.bin"]}))
    (directory / "train-r1-w0.json").symlink_to(secret)
    os.mkfifo(directory / "train-r2-w0.json")
    os.link(secret, directory / "train-r3-w0.json")
    (directory / "train-r4-w0.json").write_bytes(b" " * (REQUEST_MAX_BYTES + 1) + b"{}")
    (directory / "train-r5-w0.json").write_text("{not json")
    (directory / "train-r6-w0.json").write_text(json.dumps({"need": ["../../etc/passwd"]}))
    (directory / "validation-r2-w0.json").write_text(json.dumps({"need": ["000001.bin"]}))
    (directory / "notes.txt").write_text("hello")
    (directory / "train-r7-w0.json").mkdir()

    for _ in range(3):  # re-read: unchanged files are neither read nor reported again
        assert requests.read() == [
            Request("train-r0-w0.json", "train", ("000001.bin", "000002.bin")),
            Request("validation-r1-w0.json", "validation", ("000000.bin",)),
        ]
    reasons = {line.split("'")[1]: line for line in said}
    assert len(said) == len(reasons) == 9
    assert "symbolic link" in reasons["train-r1-w0.json"]
    assert "not a regular file" in reasons["train-r2-w0.json"]
    assert "not a regular file" in reasons["train-r7-w0.json"]  # (a directory)
    assert "hard link" in reasons["train-r3-w0.json"]
    assert f"more than {REQUEST_MAX_BYTES} bytes" in reasons["train-r4-w0.json"]
    assert "not a shard request" in reasons["train-r5-w0.json"]
    assert "does not have" in reasons["train-r6-w0.json"]
    assert "does not have" in reasons["validation-r2-w0.json"]
    assert "not a request file name" in reasons["notes.txt"]
    assert all(line.startswith("ace3: ignored shard request") for line in said)

    (directory / "train-r5-w0.json").write_text(json.dumps({"need": ["000000.bin"]}))
    assert Request("train-r5-w0.json", "train", ("000000.bin",)) in requests.read()


def test_a_request_directory_replaced_by_a_link_is_not_read(tmp_path: Path) -> None:
    requests, directory, said = reader(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "train-r0-w0.json").write_text(json.dumps({"need": ["000000.bin"]}))
    directory.rmdir()
    directory.symlink_to(elsewhere)
    assert requests.read() == [] and said == []


def test_each_readers_current_shard_comes_before_any_look_ahead() -> None:
    order = priority(
        [
            Request("train-r0-w0.json", "train", ("a", "b", "c")),
            Request("train-r1-w0.json", "train", ("d", "a")),
            Request("validation-r0-w0.json", "validation", ("a",)),
        ]
    )
    assert order == [
        (("train", "a"), True),
        (("train", "d"), True),
        (("validation", "a"), True),
        (("train", "b"), False),
        (("train", "c"), False),
    ]


def test_a_request_over_4_kib_is_refused_and_a_changed_one_read_at_most_every_50_ms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(shard_requests.time, "monotonic", lambda: now[0])
    requests, directory, said = reader(tmp_path)
    (directory / "train-r1-w0.json").write_text('{"need": []}' + " " * 4096)
    path = directory / "train-r0-w0.json"
    path.write_text(json.dumps({"need": ["000000.bin"]}))
    assert requests.read() == [Request("train-r0-w0.json", "train", ("000000.bin",))]
    assert "more than 4096 bytes" in said[0]
    path.write_text(json.dumps({"need": ["000001.bin", "000002.bin"]}))
    now[0] += 0.01
    assert requests.read() == [Request("train-r0-w0.json", "train", ("000000.bin",))]
    now[0] += 0.05
    assert requests.read() == [Request("train-r0-w0.json", "train", ("000001.bin", "000002.bin"))]
