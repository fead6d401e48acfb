"""``ace3 up``'s worker environment and ``ace3 worker``'s Celery arguments (fast, nothing
started; tests/integration/cli/test_cli_up.py starts the real thing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from ace3.cli import build_parser, worker_argv
from ace3.cli.service import up_exit_code, up_worker_env


def test_up_exits_0_when_the_children_it_stopped_die_of_its_sigterm() -> None:
    # The CI saw exit code 241 (sys.exit(-15)): uvicorn re-raises the SIGTERM after its
    # shutdown, and a worker stopped while still starting has no handler yet.
    assert up_exit_code(-15, stopped=True) == 0
    assert up_exit_code(0, stopped=True) == 0
    assert up_exit_code(-15, stopped=False) == 143  # died of someone else's SIGTERM
    assert up_exit_code(-9, stopped=True) == 137  # killed: not a clean stop
    assert up_exit_code(3, stopped=False) == 3


def test_up_workers_admit_the_documents_num_gpus_8_unless_the_user_set_a_cap() -> None:
    data = Path("/data")
    assert up_worker_env({}, data, 1, 1)["ACE3_WORKER_CPU_PROCESSES"] == "8"
    assert "ACE3_WORK_DIR" not in up_worker_env({}, data, 1, 1)
    mine = up_worker_env({"ACE3_WORKER_CPU_PROCESSES": "2"}, data, 1, 1)
    assert mine["ACE3_WORKER_CPU_PROCESSES"] == "2"


def test_several_up_workers_get_their_own_work_dirs_and_a_local_rendezvous() -> None:
    first, second = (up_worker_env({}, Path("/data"), index, 2) for index in (1, 2))
    assert first["ACE3_WORK_DIR"] != second["ACE3_WORK_DIR"]
    assert first["ACE3_WORKER_ADVERTISE_HOST"] == "127.0.0.1"


def test_worker_node_names_and_production_defaults() -> None:
    settings = SimpleNamespace(log_level="info", worker_slots=2, queue_name="q", log_format="text")
    argv = worker_argv(settings, None, "w2@%h")
    assert argv[argv.index("--hostname") + 1] == "w2@%h"
    assert "--hostname" not in worker_argv(settings)
    args = build_parser().parse_args(["worker", "--node-name", "w1@%h"])
    assert args.node_name == "w1@%h"
    assert build_parser().parse_args(["up", "--workers", "2"]).workers == 2


def test_worker_concurrency_is_the_slot_count_every_share_uses(tmp_path: Path) -> None:
    """``ace3 worker --concurrency 3`` with ACE3_WORKER_SLOTS=1: the worker's settings (each
    job's memory limit, BLAS threads, GPUs, dataset cache share) divide the machine by 3, the
    slots Celery runs (a fresh interpreter: the worker reads its settings once, at import)."""
    probe = (
        "from unittest import mock\n"
        "import celery\n"
        "from ace3.cli import main\n"
        "def worker_main(self, argv):\n"
        "    from ace3_worker.celery_app import settings\n"
        "    print(settings.worker_slots, argv[argv.index('--concurrency') + 1])\n"
        "with mock.patch.object(celery.Celery, 'worker_main', worker_main):\n"
        "    main(['worker', '--concurrency', '3'])\n"
        "    main(['worker', '--concurrency', '0'])\n"
    )
    env = {**os.environ, "ACE3_WORKER_SLOTS": "1", "ACE3_DATA_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.splitlines() == ["3 3"], done.stderr
    assert "--concurrency must be at least 1, not 0" in done.stderr
