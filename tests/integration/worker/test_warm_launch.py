"""The warm path against the cold one, in the worker's real sandbox (bubblewrap, a dedicated uid)
with real torchrun and gloo ranks: the same job gives bit-identical losses and weights and the
same environment either way, a job a prepared sandbox cannot run takes the cold path and says
why, and a launcher that died or is older than the code on disk is never used."""

from __future__ import annotations

import json
import os
import shutil
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from ace3.files import sha256_file
from ace3_control.settings import Settings
from ace3_control.storage import LocalArtifactStore
from ace3_worker import warm as warm_module
from ace3_worker.job_dir import JobDirectory, prepare_job_directory
from ace3_worker.launch import LaunchSpec, RunningTorchrun, job_environment, start_torchrun
from ace3_worker.launcher import torchrun_command, warm_torchrun_args
from ace3_worker.sandbox.identity import JobIdentity
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.warm import WarmSlot
from ace3_worker.warm_sandbox import WarmSandbox
from ace3_worker.workspace import Workspace, job_owner

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("bwrap") is None or os.geteuid() != 0,
        reason="needs bubblewrap and root (CI installs bubblewrap and runs as root)",
    ),
]

# Records what each rank sees of its process: its environment, threads and command line.
MODEL = """
import json, os, sys
import torch
from torch import nn


def build_model():
    seen = {"env": dict(os.environ), "threads": torch.get_num_threads(),
            "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd()}
    rank = os.environ.get("RANK", "0")
    with open(f"/job/output/artifacts/seen-{rank}.json", "w") as file:
        json.dump(seen, file)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10))
"""

# Leaves a child behind: a fork that never execs holds whatever its rank's process held.
FORKER = """
import os, time
from torch import nn


def build_model():
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)
    return nn.Linear(64, 10)
"""

# What differs between any two runs of a job: the job, the agent's run and rendezvous.
PER_RUN = {"ACE3_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE"}


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("warm")
    settings = Settings(
        data_dir=root, sandbox="bwrap", worker_device="cpu", worker_slots=1, warm_launch=True
    )
    store = LocalArtifactStore(root / "store")
    rows = {}
    rng = np.random.default_rng(0)
    np.savez(
        root / "data.npz",
        inputs=rng.normal(size=(256, 64)).astype(np.float32),
        targets=rng.integers(0, 10, 256),
    )
    (root / "model.py").write_text(MODEL)
    (root / "forker.py").write_text(FORKER)
    for name, key in (
        ("model.py", "models/o/m/model.py"),
        ("forker.py", "models/o/f/model.py"),
        ("data.npz", "datasets/o/d/d.npz"),
    ):
        store.put_file(key, root / name)
        rows[name] = SimpleNamespace(
            id=name, filename=name, storage_key=key, sha256=sha256_file(root / name),
            kind="file", entry_module=None, factory="build_model",
        )  # fmt: skip
    workspace = Workspace(settings, None, store)  # type: ignore[arg-type]
    limits = JobLimits.from_settings(settings)
    return SimpleNamespace(
        settings=settings, store=store, rows=rows, workspace=workspace, limits=limits
    )


def _slot(worker: SimpleNamespace, **changes: Any) -> WarmSlot:
    settings = worker.settings.model_copy(update=changes)
    return WarmSlot(settings, Workspace(settings, None, worker.store), worker.limits, None)  # type: ignore[arg-type]


def _prepared(slot: WarmSlot) -> WarmSandbox | None:
    """The slot's next sandbox, once its preparation (on the slot's own thread) is done."""
    slot.prepare()
    warm = slot.take()
    if warm is not None:
        slot.keep(warm)
    return warm


def _directory(
    worker: SimpleNamespace,
    slot: WarmSlot,
    job_id: str,
    identity: JobIdentity | None,
    warm: WarmSandbox | None,
    model: str = "model.py",
    nproc: int = 2,
) -> JobDirectory:
    config = {"num_gpus": nproc, "epochs": 2, "batch_size": 32, "seed": 11, "log_interval": 1}
    job = SimpleNamespace(id=job_id, config=config, model_kwargs={}, micro_batch_halvings=0)
    return prepare_job_directory(
        worker.settings.resolved_work_dir,
        worker.store,
        job,  # type: ignore[arg-type]
        1,
        worker.rows[model],
        worker.rows["data.npz"],
        None,
        None,
        visible_root=worker.workspace.plan.visible_root,
        owner=job_owner(identity),
        skeleton=slot.skeleton_for(warm),
    )


def _run(
    worker: SimpleNamespace,
    slot: WarmSlot,
    job_id: str,
    warm_args: bool = True,
    model: str = "model.py",
    nproc: int = 2,
) -> tuple[JobDirectory, str, int]:
    """One job of ``nproc`` ranks through ``slot``: (its directory, the path's log line, exit
    status)."""
    warm = slot.take()
    identity = warm.identity if warm is not None else worker.workspace.lease_identity()
    try:
        directory = _directory(worker, slot, job_id, identity, warm, model, nproc)
        job_file = str(directory.visible(directory.job_file))
        spec = LaunchSpec(
            torchrun_command(job_file, nproc),
            warm_args=warm_torchrun_args(job_file, nproc) if warm_args else None,
        )
        env = job_environment(
            worker.settings, directory, identity, device="cpu", job_id=job_id, nproc=nproc
        )

        def cold() -> RunningTorchrun:
            return start_torchrun(
                worker.settings, worker.workspace.plan, worker.limits, spec, env,
                directory=directory, identity=identity, device="cpu",
            )  # fmt: skip

        running, note = slot.start(warm, spec, env, cold)
        running.process.wait(timeout=120)
        code = running.stop()
        output = "\n".join(line.line for line in list(running.lines.queue))
        assert code == 0, output[-3000:]
        return directory, note, code
    finally:
        if warm is not None:
            slot.discard(warm, keep_identity=True)
        if identity is not None:
            identity.release()


def _losses(directory: JobDirectory) -> list[tuple[str, int, float]]:
    records = [json.loads(line) for line in directory.events_file.read_text().splitlines()]
    return [
        (name, record["step"], value)
        for record in records
        if record["type"] == "metrics"
        for name, value in record["values"].items()
        if name in ("train_loss", "val_loss", "epoch_train_loss")
    ]


def _flat(value: Any) -> Any:
    """A checkpoint's state with each tensor as (dtype, shape, bytes): comparable with ==."""
    if isinstance(value, dict):
        return {key: _flat(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_flat(item) for item in value]
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), tuple(value.shape), value.numpy().tobytes())
    return value


def _seen(directory: JobDirectory, rank: int) -> dict[str, Any]:
    return json.loads((directory.artifacts_dir / f"seen-{rank}.json").read_text())


def test_a_job_run_warm_matches_the_same_job_run_cold_bit_for_bit(worker: SimpleNamespace) -> None:
    slot = _slot(worker)
    assert _prepared(slot) is not None
    warm_dir, warm_note, _ = _run(worker, slot, "jobwarm")
    assert warm_note.startswith("ace3: warm start: a sandbox prepared"), warm_note
    cold_slot = _slot(worker, warm_launch=False)
    assert _prepared(cold_slot) is None, "warm launch off: nothing is prepared"
    cold_dir, cold_note, _ = _run(worker, cold_slot, "jobcold")
    assert cold_note == "ace3: cold start: warm launch is off (ACE3_WARM_LAUNCH=false)"

    assert _losses(warm_dir) and _losses(warm_dir) == _losses(cold_dir)
    last = sorted(warm_dir.checkpoints_dir.glob("step-*.pt"))[-1].name
    warm_state, cold_state = (
        torch.load(directory.checkpoints_dir / last, weights_only=True)
        for directory in (warm_dir, cold_dir)
    )
    # The same weights, optimizer state, RNG states and data position (what a process
    # measured of itself, its memory and step times, is not part of the run's result).
    for state in (warm_state, cold_state):
        state.pop("last_metrics")
    assert _flat(warm_state) == _flat(cold_state)
    for rank in (0, 1):
        warm_seen, cold_seen = _seen(warm_dir, rank), _seen(cold_dir, rank)
        assert warm_seen["env"].keys() == cold_seen["env"].keys(), "nothing of the launcher's"
        assert {k: v for k, v in warm_seen["env"].items() if k not in PER_RUN} == {
            k: v for k, v in cold_seen["env"].items() if k not in PER_RUN
        }
        assert warm_seen["env"]["ACE3_JOB_ID"] == "jobwarm"
        for key in ("threads", "path0", "cwd"):
            assert warm_seen[key] == cold_seen[key], key
        assert warm_seen["argv"][1:] == cold_seen["argv"][1:] == ["--job", "/job/job.json"]


def test_a_job_a_prepared_sandbox_cannot_run_takes_the_cold_path_and_says_why(
    worker: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    slot = _slot(worker)
    first = _prepared(slot)
    assert first is not None
    # A node of a multi-node job (no warm arguments): the same sandbox's uid and directory.
    directory, note, _ = _run(worker, slot, "jobmulti", warm_args=False, nproc=1)
    assert note.startswith("ace3: cold start: a multi-node job's nodes meet over the host's"), note
    assert first.stopped and not first.handed and _losses(directory)

    # A launcher started before the code on disk changed is replaced, never used.
    stale = _prepared(slot)
    assert stale is not None and stale.wait_started() is None
    monkeypatch.setattr(warm_module, "code_fingerprint", lambda: "0" * 64)
    assert slot._unusable(stale) == (
        "the worker's code changed on disk after the prepared launcher started"
    )
    monkeypatch.undo()
    # One that died while it waited, too.
    stale.process.kill()
    stale.process.wait()
    reason = slot._unusable(stale)
    assert reason is not None and reason.startswith("the prepared launcher exited"), reason
    directory, note, _ = _run(worker, slot, "jobdead", nproc=1)
    assert note.startswith("ace3: cold start: the prepared launcher exited"), note
    assert stale.stopped and not stale.directory.root.exists()
    fresh = _prepared(slot)  # (the slot has a new one, ready for the next job)
    assert fresh is not None and fresh is not stale
    slot.discard(slot.take())  # type: ignore[arg-type]


def test_a_child_a_rank_forked_does_not_keep_its_job_running(worker: SimpleNamespace) -> None:
    """Its child holds what the rank held: the agent learns the rank's end from the zygote that
    reaps it (:mod:`ace3.runtime.process.rank_zygote`), not from a pipe the child would keep
    open, so the job ends with its rank."""
    slot = _slot(worker)
    slot.prepare()
    started = time.monotonic()
    _, note, code = _run(worker, slot, "jobforker", model="forker.py", nproc=1)
    assert note.startswith("ace3: warm start") and code == 0
    assert time.monotonic() - started < 60, "the job waited for its rank's child"
