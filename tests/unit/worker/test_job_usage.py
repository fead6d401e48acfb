"""The worker's measurements of a running job (ace3_worker.job_usage): the blocks its files hold
(sparse files, hard links, links out of the job and very many files cannot fool it) and the
memory its processes hold (PSS, so pages shared by forked processes count once, and shared
memory once whether it is mapped or sits in /dev/shm)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from ace3_worker.deleted_files import open_deleted_bytes
from ace3_worker.job_usage import (
    MAX_DEPTH,
    ProcessEntry,
    _reopen,
    disk_usage,
    job_processes,
    memory_usage,
    owned_bytes,
    parse_rollup,
    process_table,
    read_rollup,
    used_bytes,
)

MIB = 1 << 20


def _write(path: Path, size: int) -> None:
    with path.open("wb") as file:
        file.write(os.urandom(4096) * (size // 4096))
        file.flush()
        os.fsync(file.fileno())  # (blocks allocated, not only reserved)


def test_disk_usage_counts_allocated_blocks_once_per_inode_and_follows_no_link(
    tmp_path: Path,
) -> None:
    output, home = tmp_path / "output", tmp_path / "home"
    (output / "deep" / "er").mkdir(parents=True)
    home.mkdir()
    empty = disk_usage([output, home], 1000)
    assert empty.complete and empty.entries == 4

    _write(output / "deep" / "er" / "data", 4 * MIB)
    with (output / "sparse").open("wb") as sparse:  # 1 GiB apparent, one block written
        sparse.seek(1 << 30)
        sparse.write(b"x")
    os.link(output / "deep" / "er" / "data", home / "same-inode")
    outside = tmp_path / "outside"
    _write(outside, 8 * MIB)
    (home / "link-out").symlink_to(outside)

    usage = disk_usage([output, home], 1000)
    written = usage.bytes - empty.bytes
    assert 4 * MIB <= written < 4 * MIB + 64 * 1024, written
    assert usage.entries == 4 + 4 and usage.complete

    stopped = disk_usage([output, home], 5)
    assert not stopped.complete and stopped.entries == 6, "the walk stops past max_entries"
    assert disk_usage([tmp_path / "gone"], 10) == disk_usage([], 10)


def test_directories_deeper_than_a_path_can_name_are_measured_and_depth_is_bounded(
    tmp_path: Path,
) -> None:
    top = tmp_path / "tmp"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(20):  # 20 names of 250 characters: past PATH_MAX (4096)
            os.mkdir("d" * 250, dir_fd=fd)
            deeper = os.open("d" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        data = os.open("data", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(data, os.urandom(MIB))
        os.fsync(data)
        os.close(data)
    finally:
        os.close(fd)
    usage = disk_usage([top], 1000)
    assert usage.complete and usage.entries == 22 and usage.bytes >= MIB, usage

    nested = tmp_path / "nested"
    path = nested
    for _ in range(MAX_DEPTH + 1):
        path = path / "n"
    path.mkdir(parents=True)
    deep = disk_usage([nested], 10_000)
    assert not deep.complete and deep.too_deep, deep


def test_an_unreadable_directory_of_the_worker_s_own_is_made_readable_again(
    tmp_path: Path,
) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    _write(hidden / "data", MIB)
    hidden.chmod(0)
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert _reopen("hidden", parent)
    finally:
        os.close(parent)
    assert hidden.stat().st_mode & 0o700 == 0o700
    assert disk_usage([tmp_path], 100).bytes >= MIB


def test_rollups_are_read_with_and_without_the_pss_breakdown() -> None:
    modern = "Rss: 900 kB\nPss: 500 kB\nPss_Anon: 300 kB\nPss_File: 150 kB\n" \
             "Pss_Shmem: 50 kB\nSwap: 0 kB\nSwapPss: 20 kB\n"  # fmt: skip
    rollup = parse_rollup("55a0-7ffd ---p 00000000 00:00 0   [rollup]\n" + modern)
    assert (rollup.private, rollup.shared_memory) == (320 * 1024, 50 * 1024)
    old = parse_rollup("Rss: 900 kB\nPss: 500 kB\nSwapPss: 20 kB\n")
    assert (old.private, old.shared_memory) == (520 * 1024, 0)


def test_job_processes_are_the_sandbox_s_tree_and_its_uid() -> None:
    table = [
        ProcessEntry(1, 0, 1, 0),
        ProcessEntry(100, 1, 9, 0),  # the sandbox (bubblewrap)
        ProcessEntry(101, 100, 9, 0),  # its init
        ProcessEntry(102, 101, 9, 5000),  # torchrun
        ProcessEntry(103, 102, 9, 5000),  # a rank
        ProcessEntry(104, 1, 9, 5000),  # a process of the job's uid that left the tree
        ProcessEntry(105, 104, 9, 5000),
        ProcessEntry(200, 1, 9, 1000),  # someone else's
        ProcessEntry(201, 200, 9, 5001),
    ]
    assert [p.pid for p in job_processes(table, 100, 5000)] == [100, 101, 102, 103, 104, 105]
    assert [p.pid for p in job_processes(table, 100, None)] == [100, 101, 102, 103]
    assert job_processes(table, 999, None) == []


def test_the_process_table_gives_parents_and_real_uids() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        rows = {row.pid: row for row in process_table(uids=True)}
        assert rows[child.pid].ppid == os.getpid() and rows[child.pid].uid == os.getuid()
        assert process_table()[0].uid is None, "uids only when asked for"
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def forked(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A process holding 64 MiB it wrote, and a forked child sharing those pages (and a 32 MiB
    file in /dev/shm both map); ``(process, shm file size)``."""
    shm = Path("/dev/shm") / f"ace3-test-{os.getpid()}-{tmp_path.name}"
    script = textwrap.dedent(f"""
        import mmap, os, sys
        held = bytearray(os.urandom(1 << 20) * 64)
        with open({str(shm)!r}, "w+b") as file:
            file.truncate(32 << 20)
            shared = mmap.mmap(file.fileno(), 32 << 20)
            shared.write(b"x" * (32 << 20))
        child = os.fork()
        print(child, flush=True)
        sys.stdin.read()
        if child:
            os.waitpid(child, 0)
    """)
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        int(process.stdout.readline())
        yield process, 32 * MIB
    finally:
        process.kill()
        process.wait()
        shm.unlink(missing_ok=True)


def test_memory_counts_pages_shared_by_forks_once_and_shared_memory_once(
    forked: tuple[subprocess.Popen[str], int],
) -> None:
    process, shm_size = forked
    processes = job_processes(process_table(), process.pid, None)
    assert len(processes) == 2, "the process and its fork"
    usage = memory_usage(processes, shm_bytes=shm_size)
    rss = 0
    for entry in processes:
        status = Path(f"/proc/{entry.pid}/status").read_text()
        rss += int(
            next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1]
        )
    assert rss * 1024 > 2 * 64 * MIB + shm_size, "RSS counts the forks' shared pages twice"
    assert 64 * MIB <= usage.private < 100 * MIB, usage
    assert shm_size <= usage.shared_memory < shm_size + 4 * MIB, usage
    assert usage.bytes == usage.private + usage.shared_memory < 140 * MIB
    bigger = memory_usage(processes, shm_bytes=3 * shm_size)
    assert bigger.shared_memory == 3 * shm_size, "unmapped /dev/shm files count too"


def test_a_number_that_is_another_process_s_now_is_not_read(
    forked: tuple[subprocess.Popen[str], int],
) -> None:
    process, _ = forked
    entry = next(p for p in process_table() if p.pid == process.pid)
    assert read_rollup(entry) is not None
    assert read_rollup(ProcessEntry(entry.pid, entry.ppid, entry.started + 1)) is None


def test_a_tmpfs_s_use_and_a_uid_s_files_in_it(tmp_path: Path) -> None:
    shm = Path("/dev/shm") / f"ace3-test-{os.getpid()}"
    try:
        _write(shm, 8 * MIB)
        assert used_bytes(Path("/dev/shm")) >= 8 * MIB  # (others may use it too: no difference)
        assert owned_bytes(Path("/dev/shm"), os.geteuid(), 10_000) >= 8 * MIB
        assert owned_bytes(Path("/dev/shm"), 3_999_999_999, 10_000) == 0
    finally:
        shm.unlink(missing_ok=True)
    assert used_bytes(tmp_path / "absent") == 0


def test_files_deleted_while_open_still_count_once_on_the_job_s_filesystem(tmp_path: Path) -> None:
    """A job that deletes what it writes but keeps it open holds the blocks all the same, and
    no walk by names meets them."""
    script = textwrap.dedent(
        """
        import os, sys, time
        directory = sys.argv[1]
        kept = []
        for name in ("a", "b"):
            path = os.path.join(directory, name)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            os.write(fd, os.urandom(4 << 20))
            os.unlink(path)
            kept += [fd, os.dup(fd)]  # (the same file twice: one inode)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        assert disk_usage([tmp_path], 1000).bytes < MIB, "the walk sees nothing"
        processes = job_processes(process_table(), holder.pid, None)
        device = os.stat(tmp_path).st_dev
        held = open_deleted_bytes(processes, {device})
        assert 8 * MIB <= held < 9 * MIB
        assert open_deleted_bytes(processes, {device + 1}) == 0, "another filesystem's"
    finally:
        holder.kill()
        holder.wait()


def test_a_uid_s_files_count_in_the_directories_it_made_too(tmp_path: Path) -> None:
    """(ACE3_SANDBOX=uid: the host's /dev/shm, where a job may make directories of its own.)"""
    _write(tmp_path / "top", MIB)
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    _write(nested / "deep", 2 * MIB)
    (tmp_path / "link").symlink_to(nested)  # (never followed: counted once)
    counted = owned_bytes(tmp_path, os.geteuid(), 100)
    assert 3 * MIB <= counted < 4 * MIB
    assert owned_bytes(tmp_path, 3_999_999_999, 100) == 0
