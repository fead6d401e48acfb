"""The same attacks on the embedded defaults (``ace3 up``: SQLite under the data directory, the
filesystem broker, local storage): the database is a file a plain ``--ro-bind / /`` would hand
the job, so here the sandbox must hide the file itself."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import ace3
from tests.conftest import DigitsFiles, Stack, _stop, free_port
from tests.e2e.conftest import processes_of_job, wait_for
from tests.security import hostile

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """API and worker on the embedded defaults: nothing but ACE3_DATA_DIR."""
    root = tmp_path_factory.mktemp("embedded")
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith("ACE3_")} | {
        "ACE3_DATA_DIR": str(root),
        "ACE3_WORKER_DEVICE": "cpu",
        "ACE3_HEARTBEAT_SECONDS": "1",
        "ACE3_WORKER_SLOTS": "1",
        # (its own uids: the production-path stack of this test run may use the default ones)
        "ACE3_SANDBOX_UID_BASE": "61500",
    }
    stack = Stack(base_url=f"http://127.0.0.1:{port}", port=port, env=env, root=root)
    migrated = stack.cli("migrate")
    assert migrated.returncode == 0, migrated.stderr
    stack.start_worker()
    try:
        stack.start_api()
        yield stack
    finally:
        for process in stack.processes.values():
            _stop(process)
        shutil.rmtree(root / "jobs", ignore_errors=True)


def test_an_embedded_job_reaches_neither_the_database_file_nor_the_store(
    embedded_stack: Stack, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    marker = f"embedded-secret-{secrets.token_hex(8)}"
    victim_key, _ = embedded_stack.create_key("victim")
    secret_file = tmp_path / "secret.csv"
    secret_file.write_text(f"{marker},label\n1,1\n")  # (in the header: cells are numbers)
    with ace3.Client(api_key=victim_key, base_url=embedded_stack.base_url) as victim:
        victim.load_dataset(secret_file)

    key, _ = embedded_stack.create_key("attacker")
    model_file = tmp_path / "probes.py"
    model_file.write_text(hostile.model_source(hostile.PROBES))
    database = embedded_stack.root / "ace3.db"
    assert database.exists()
    with ace3.Client(api_key=key, base_url=embedded_stack.base_url) as sdk:
        result = ace3.Trainer(ace3.TrainingConfig(batch_size=64, max_steps=2)).train(
            sdk.load_model(model_file),
            sdk.load_dataset(digits_files.train),
            epochs=1,
            show_progress=False,
            model_kwargs={
                "attacks": ["environ", "network", "files", "inputs"],
                "targets": [["127.0.0.1", embedded_stack.port]],
                "data_dir": str(embedded_stack.root),
                "marker": marker,
            },
        )
        lines = [line.line for line in sdk.jobs.iter_logs(result.job_id)]
    found = hostile.verdicts(lines)
    assert set(found) == {"environ", "network", "files", "inputs"}, lines[-20:]
    for attack, (state, detail) in found.items():
        assert state == "blocked", f"{attack}: {detail}"
    wait_for(lambda: not processes_of_job(result.job_id), 10, "the job's processes to exit")

    with sqlite3.connect(database) as connection:  # the stored inputs are what was uploaded
        rows = connection.execute("SELECT storage_key, sha256 FROM datasets").fetchall()
    for storage_key, sha256 in rows:
        data = (embedded_stack.root / "storage" / storage_key).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha256
