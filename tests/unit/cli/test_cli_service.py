"""``ace3 up``'s worker environment and ``ace3 worker``'s Celery arguments (fast, nothing
started; tests/integration/cli/test_cli_up.py starts the real thing)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from ace3.cli import build_parser, worker_argv
from ace3.cli.service import up_worker_env


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
