"""The training engine under real torchrun (gloo, CPU) on scikit-learn's digits.

Every run here is a real ``torchrun --standalone`` of the engine on a job.json, its ranks forked
from a warm launcher as on a worker, except the main run (``-m ace3.runtime``: the cold path),
which the warm repeat must match bit for bit; runs are shared between tests through
module-scoped fixtures to keep the total time small.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.model_files import OOM_ON_RANK_1_MODEL_FILE
from tests.warm_runs import WARM_RUNS

pytestmark = pytest.mark.slow

SDK = Path(__file__).resolve().parents[3] / "sdk"

MODEL_FILE = """
from torch import nn


def build_model(hidden=64, dropout=0.1):
    return nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, 10)
    )
"""

BAD_MODEL_FILE = """
def build_model(**kwargs):
    raise RuntimeError("the user factory exploded")
"""


def run_job(
    job: dict[str, Any], job_dir: Path, nproc: int | None = 2, cold: bool = False
) -> subprocess.CompletedProcess:
    """Write job.json and run it: under torchrun with ``nproc`` ranks, or plainly if None. The
    ranks are forks of a warm launcher, as on a worker (:mod:`tests.warm_runs`), unless
    ``cold``: then torchrun starts each rank as ``python -m ace3.runtime``."""
    job_dir.mkdir(parents=True, exist_ok=True)
    job = {**job, "output_dir": str(job_dir / "output")}
    job_path = job_dir / "job.json"
    job_path.write_text(json.dumps(job))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ACE3_DEVICE": "cpu",
        "PYTHONPATH": os.pathsep.join([str(SDK), os.environ.get("PYTHONPATH", "")]),
    }
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    if nproc is not None and not cold:
        return WARM_RUNS.run(str(job_path), nproc, env)
    if nproc is None:
        cmd = [sys.executable, "-m", "ace3.runtime", "--job", str(job_path)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(nproc), "-m", "ace3.runtime", "--job", str(job_path)]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)


def events(job_dir: Path) -> list[dict[str, Any]]:
    lines = (job_dir / "output" / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def train_losses(evs: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return [
        (e["step"], e["values"]["train_loss"])
        for e in evs
        if e["type"] == "metrics" and "learning_rate" in e["values"]
    ]


def final_weights(job_dir: Path) -> dict[str, torch.Tensor]:
    ckpts = sorted((job_dir / "output" / "checkpoints").glob("step-*.pt"))
    return torch.load(ckpts[-1], weights_only=True)["model"]


def assert_ok(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("runtime")
    digits = load_digits()
    np.savez(
        root / "digits.npz",
        X=(digits.data / 16.0).astype(np.float32),
        y=digits.target.astype(np.int64),
    )
    (root / "model.py").write_text(MODEL_FILE)
    (root / "bad_model.py").write_text(BAD_MODEL_FILE)
    return root


@pytest.fixture(scope="module")
def base_job(workdir: Path) -> dict[str, Any]:
    return {
        "job_id": "digits",
        "attempt": 1,
        "config": {
            "num_gpus": 2, "epochs": 3, "batch_size": 64, "learning_rate": 0.01,
            "validation_split": 0.2, "log_interval": 5, "save_interval": 20,
            "max_checkpoints": 2, "seed": 123,
        },
        "model": {"path": str(workdir / "model.py"), "kind": "file",
                  "factory": "build_model", "kwargs": {"hidden": 64, "dropout": 0.1}},
        "dataset": {"path": str(workdir / "digits.npz")},
        "validation_dataset": None,
        "resume_from": None,
    }  # fmt: skip


@pytest.fixture(scope="module")
def main_run(workdir: Path, base_job: dict[str, Any]) -> tuple[Path, subprocess.CompletedProcess]:
    job_dir = workdir / "main"
    done = run_job(base_job, job_dir, cold=True)  # (the repeat below runs warm: the same)
    assert_ok(done)
    return job_dir, done


def test_trains_digits_to_accuracy(main_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    job_dir, _ = main_run
    summary = events(job_dir)[-1]
    assert summary["type"] == "summary"
    assert summary["final_metrics"]["val_accuracy"] >= 0.90
    assert summary["best_val_accuracy"] >= summary["final_metrics"]["val_accuracy"]
    assert summary["steps"] == 3 * 23 and summary["epochs"] == 3


def test_events_and_checkpoints(main_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    job_dir, _ = main_run
    evs = events(job_dir)
    metrics = [e for e in evs if e["type"] == "metrics"]
    assert metrics[0]["step"] == 1 and "train_loss" in metrics[0]["values"]  # first step reported
    steps = [step for step, _ in train_losses(evs)]
    assert steps[:4] == [1, 5, 10, 15]
    for e in metrics:
        if "learning_rate" in e["values"]:
            assert e["values"]["learning_rate"] == 0.01 and e["values"]["samples_per_sec"] > 0
            assert e["values"]["epoch"] == e["epoch"]
    epoch_ends = [e for e in metrics if "val_loss" in e["values"]]
    assert [e["epoch"] for e in epoch_ends] == [1, 2, 3]
    assert all({"epoch_train_loss", "val_accuracy"} <= e["values"].keys() for e in epoch_ends)

    ckpt_events = [e for e in evs if e["type"] == "checkpoint"]
    assert [e["step"] for e in ckpt_events] == [20, 40, 60, 69]
    # The engine keeps its newest three files (the worker has copied the older ones into the
    # store by then, and deletes nothing of the job's); the store keeps what max_checkpoints says.
    on_disk = sorted(p.name for p in (job_dir / "output" / "checkpoints").iterdir())
    assert on_disk == [f"step-{step:08d}.pt" for step in (40, 60, 69)]
    for e in ckpt_events[-2:]:
        path = Path(e["path"])
        assert path.name == e["name"] and path.stat().st_size == e["size_bytes"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == e["sha256"]
        assert "train_loss" in e["metrics"]
        state = torch.load(path, weights_only=True)
        assert state["step"] == e["step"] and set(state["rng_per_rank"][1]) == {
            "python",
            "numpy",
            "torch",
            "cuda",
        }
        assert len(state["rng_per_rank"]) == 2
    assert evs[-1]["type"] == "summary" and evs[-2]["type"] == "checkpoint"


def test_both_ranks_log(main_run: tuple[Path, subprocess.CompletedProcess]) -> None:
    _, done = main_run
    out = done.stdout
    assert "[rank 0] ready: world_size=2 backend=gloo device=cpu" in out
    assert "[rank 1] ready: world_size=2 backend=gloo device=cpu" in out
    assert "[rank 0] step 1 " in out


def test_same_seed_same_losses(
    workdir: Path, base_job: dict[str, Any], main_run: tuple[Path, subprocess.CompletedProcess]
) -> None:
    job_dir = workdir / "repeat"
    assert_ok(run_job(base_job, job_dir))
    first, second = events(main_run[0]), events(job_dir)
    assert train_losses(first) == train_losses(second)
    val = [
        [e["values"].get("val_loss") for e in evs if e["type"] == "metrics"]
        for evs in (first, second)
    ]
    assert val[0] == val[1]
    a, b = final_weights(main_run[0]), final_weights(job_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_is_bit_identical(
    workdir: Path, base_job: dict[str, Any], main_run: tuple[Path, subprocess.CompletedProcess]
) -> None:
    # Stop mid-epoch 2 (step 30 of 69, not a save_interval multiple), then resume from there.
    stopped = copy.deepcopy(base_job)
    stopped["config"]["max_steps"] = 30
    assert_ok(run_job(stopped, workdir / "stopped"))
    last = [e for e in events(workdir / "stopped") if e["type"] == "checkpoint"][-1]
    assert last["step"] == 30

    resumed = {
        **copy.deepcopy(base_job),
        "resume_from": last["path"],
        "resume_sha256": last["sha256"],
    }
    done = run_job(resumed, workdir / "resumed")
    assert_ok(done)
    assert "resumed from" in done.stdout
    a, b = final_weights(main_run[0]), final_weights(workdir / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # The resumed run's reported losses continue exactly where the uninterrupted one was
    # (speeds, memory and step times are measurements of the processes, not training results).
    MEASURED = ("samples_per_sec", "tokens_per_sec", "memory_mb", "peak_memory_mb",
                "step_time_ms", "gpu_util", "data_wait_ms")  # fmt: skip

    def later_metrics(evs: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
        return [
            (e["step"], {k: v for k, v in e["values"].items() if not k.startswith(MEASURED)})
            for e in evs
            if e["type"] == "metrics" and e["step"] > 30
        ]

    assert later_metrics(events(workdir / "resumed")) == later_metrics(events(main_run[0]))

    def training_figures(evs: list[dict[str, Any]]) -> dict[str, Any]:
        # Memory figures are measurements of this process, not results of the training.
        return {k: v for k, v in evs[-1]["final_metrics"].items() if "memory" not in k}

    assert training_figures(events(workdir / "resumed")) == training_figures(events(main_run[0]))


def test_resume_refuses_wrong_sha(workdir: Path, base_job: dict[str, Any], main_run) -> None:
    ckpt = sorted((main_run[0] / "output" / "checkpoints").glob("*.pt"))[0]
    job = {**base_job, "resume_from": str(ckpt), "resume_sha256": "0" * 64}
    done = run_job(job, workdir / "bad_sha", nproc=None)
    assert done.returncode != 0 and "sha256" in done.stderr


def test_gradient_accumulation_matches_large_batch(workdir: Path, base_job: dict[str, Any]) -> None:
    def job(batch_size: int, k: int) -> dict[str, Any]:
        spec = copy.deepcopy(base_job)
        spec["config"].update(
            num_gpus=1, batch_size=batch_size, gradient_accumulation_steps=k, max_steps=8,
            log_interval=1, dropout=0.0, save_interval=None, validation_split=0.0,
        )  # fmt: skip
        return spec

    assert_ok(run_job(job(32, 1), workdir / "big_batch", nproc=1))
    assert_ok(run_job(job(8, 4), workdir / "accumulated", nproc=None))  # also: no torchrun
    big, acc = (
        train_losses(events(workdir / "big_batch")),
        train_losses(events(workdir / "accumulated")),
    )
    assert [s for s, _ in big] == [s for s, _ in acc] == list(range(1, 9))
    for (_, x), (_, y) in zip(big, acc, strict=True):
        assert x == pytest.approx(y, abs=5e-6)  # equal to 5 decimals
    a, b = final_weights(workdir / "big_batch"), final_weights(workdir / "accumulated")
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_failing_model_exits_nonzero_with_traceback(
    workdir: Path, base_job: dict[str, Any]
) -> None:
    job = {**base_job, "model": {"path": str(workdir / "bad_model.py"), "factory": "build_model"}}
    done = run_job(job, workdir / "failing")
    assert done.returncode != 0
    assert "[rank 0] Traceback (most recent call last):" in done.stderr
    assert "[rank 1] RuntimeError: the user factory exploded" in done.stderr
    assert "bad_model.py" in done.stderr


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import ace3_no_such_module\n", "ModuleNotFoundError: No module named 'ace3_no_such_module'"),
        (MODEL_FILE + "\ndef compute_loss(model, batch):\n    raise KeyError('bad batch')\n",
         "KeyError: 'bad batch'"),
    ],
    ids=["import-error", "bad-batch"],
)  # fmt: skip
def test_user_errors_fail_the_run(
    workdir: Path, base_job: dict[str, Any], source: str, expected: str
) -> None:
    model = workdir / f"model_{hashlib.sha256(source.encode()).hexdigest()[:8]}.py"
    model.write_text(source)
    job = {**base_job, "model": {"path": str(model)}}
    done = run_job(job, workdir / model.stem, nproc=None)
    assert done.returncode == 1
    assert "[rank 0] Traceback (most recent call last):" in done.stderr
    assert f"[rank 0] {expected}" in done.stderr


BATCHNORM_MODEL_FILE = """
from torch import nn
def build_model():
    return nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10))
"""


def test_a_save_on_an_epoch_boundary_holds_that_epochs_validation_and_is_never_rewritten(
    workdir: Path, base_job: dict[str, Any]
) -> None:
    """23 steps per epoch, save_interval=23: every save lands on an epoch's last step."""
    job = copy.deepcopy(base_job)
    job["config"].update(save_interval=23, max_checkpoints=None, seed=5)
    job_dir = workdir / "epoch-boundary"
    assert_ok(run_job(job, job_dir))
    evs = events(job_dir)
    saves = [e for e in evs if e["type"] == "checkpoint"]
    assert [e["step"] for e in saves] == [23, 46, 69]
    validations = {
        e["step"]: e["values"]["val_accuracy"] for e in evs if "val_accuracy" in e.get("values", {})
    }
    for save in saves:
        assert save["metrics"]["val_accuracy"] == validations[save["step"]], (
            "saved after validating"
        )
    final = Path(saves[-1]["path"])
    before = hashlib.sha256(final.read_bytes()).hexdigest()

    resumed = copy.deepcopy(job)
    resumed["resume_from"], resumed["resume_sha256"] = str(final), before
    resumed_dir = workdir / "epoch-boundary-resumed"
    resumed["config"]["save_interval"] = None
    assert_ok(run_job(resumed, resumed_dir))
    assert not [e for e in events(resumed_dir) if e["type"] == "checkpoint"], "nothing new to save"
    assert hashlib.sha256(final.read_bytes()).hexdigest() == before


def test_a_checkpoint_resumes_only_on_the_process_count_that_wrote_it(
    workdir: Path, base_job: dict[str, Any], main_run: tuple[Path, subprocess.CompletedProcess]
) -> None:
    job_dir, _ = main_run
    checkpoint = sorted((job_dir / "output" / "checkpoints").glob("step-*.pt"))[0]
    job = copy.deepcopy(base_job)
    job["config"]["num_gpus"] = 1
    job["resume_from"] = str(checkpoint)
    done = run_job(job, workdir / "wrong-world", nproc=1)
    assert done.returncode != 0
    assert "written by 2 processes and this run has 1" in done.stderr


def test_validation_uses_the_buffers_the_checkpoint_holds(
    workdir: Path, base_job: dict[str, Any]
) -> None:
    (workdir / "bn_model.py").write_text(BATCHNORM_MODEL_FILE)
    job = copy.deepcopy(base_job)
    job["model"] = {
        "path": str(workdir / "bn_model.py"),
        "kind": "file",
        "factory": "build_model",
        "kwargs": {},
    }
    job["config"].update(epochs=1, save_interval=None, max_checkpoints=None)
    job_dir = workdir / "batchnorm"
    assert_ok(run_job(job, job_dir))
    reported = [e for e in events(job_dir) if "val_loss" in e.get("values", {})][-1]["values"][
        "val_loss"
    ]

    # Evaluate the saved model on the same held-out split in one process.
    sys.path.insert(0, str(SDK))
    from ace3.config import TrainingConfig
    from ace3.runtime.data.dataset_files import load_data_file
    from ace3.runtime.data.datasets import split_holdout

    config = TrainingConfig.model_validate(job["config"])
    _, validation = split_holdout(
        load_data_file(Path(job["dataset"]["path"])), config.validation_split, config.seed
    )
    exec_globals: dict[str, Any] = {}
    exec(BATCHNORM_MODEL_FILE, exec_globals)
    model = exec_globals["build_model"]()
    model.load_state_dict(final_weights(job_dir))
    model.eval()
    inputs = torch.stack([validation[i][0] for i in range(len(validation))])
    targets = torch.stack([torch.as_tensor(validation[i][1]) for i in range(len(validation))])
    with torch.no_grad():
        expected = torch.nn.functional.cross_entropy(model(inputs), targets).item()
    assert reported == pytest.approx(expected, abs=1e-6)


def test_out_of_memory_on_one_rank_ends_the_attempt_and_half_the_micro_batch_finishes_it(
    workdir: Path, base_job: dict[str, Any]
) -> None:
    """No collective of the engine's runs in a step, so a rank that runs out of memory may
    leave its peers waiting in DDP's all-reduce: it exits with OUT_OF_MEMORY_EXIT_CODE and
    torchrun stops the others (no hang). The next attempt (the worker sets micro_batch_split)
    runs the same effective batch: the same losses as a run that never ran out of memory."""
    from ace3.errors import OUT_OF_MEMORY_EXIT_CODE

    (workdir / "oom_model.py").write_text(OOM_ON_RANK_1_MODEL_FILE)
    job = copy.deepcopy(base_job)
    job["config"].update({"epochs": 1, "save_interval": None, "log_interval": 1})
    job["model"] = {"path": str(workdir / "oom_model.py"), "kind": "file",
                    "factory": "build_model", "kwargs": {"limit": 16, "after": 2}}  # fmt: skip
    done = run_job(job, workdir / "oom")
    assert done.returncode != 0
    output = done.stdout + done.stderr
    # 64 per step over 2 ranks = 32 per rank; rank 1 fails above 16 from step 3 on, while
    # rank 0 waits in DDP's bucketed all-reduce of that step's backward pass.
    assert (
        "[rank 1] StepOutOfMemoryError: out of memory at step 3 with a micro-batch of 32" in output
    )
    assert f"exitcode  : {OUT_OF_MEMORY_EXIT_CODE}" in output, "torchrun names the rank's status"
    assert not (workdir / "oom" / "output" / "checkpoints").exists() or not any(
        (workdir / "oom" / "output" / "checkpoints").iterdir()
    )

    job["micro_batch_split"] = 2  # what the worker writes for the next attempt
    retried = run_job(job, workdir / "oom-retried")
    assert_ok(retried)
    assert "micro-batch split 2 (an earlier attempt ran out of memory)" in retried.stdout
    summary = events(workdir / "oom-retried")[-1]
    assert summary["final_metrics"]["micro_batch_split"] == 2
    job["model"]["kwargs"] = {"limit": 1_000_000}
    del job["micro_batch_split"]
    reference = run_job(job, workdir / "oom-reference")
    assert_ok(reference)
    recovered, expected = (
        train_losses(events(workdir / "oom-retried")),
        train_losses(events(workdir / "oom-reference")),
    )
    assert [s for s, _ in recovered] == [s for s, _ in expected]
    for (_, a), (_, b) in zip(recovered, expected, strict=True):
        assert a == pytest.approx(b, abs=1e-5)


SKIPPING_MODEL_FILE = """
import torch
from torch import nn


class Skipping(nn.Module):
    # `never` (if any) is never used; `extra` is used by the first `extra_until` training
    # forward passes.
    def __init__(self, extra_until, with_never):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
        self.extra = nn.Linear(64, 10)
        self.never = nn.Linear(64, 10) if with_never else None
        self.extra_until, self.forwards = extra_until, 0

    def forward(self, x):
        out = self.net(x)
        if self.training:
            self.forwards += 1
            if self.forwards <= self.extra_until:
                out = out + self.extra(x)
        return out


def build_model(extra_until=1_000_000, with_never=True):
    torch.manual_seed(0)
    return Skipping(extra_until, with_never)
"""


def test_parameters_without_a_gradient_under_ddp(workdir: Path, base_job: dict[str, Any]) -> None:
    """A parameter no forward pass uses is found at step 1 (DDP then runs with
    find_unused_parameters=True); one that stops being used later needs the setting, and the
    error says so instead of DDP's."""
    (workdir / "skipping.py").write_text(SKIPPING_MODEL_FILE)
    job = copy.deepcopy(base_job)
    job["config"].update({"epochs": 1, "max_steps": 4, "save_interval": None, "log_interval": 1,
                          "validation_split": 0})  # fmt: skip
    job["model"] = {"path": str(workdir / "skipping.py"), "kind": "file",
                    "factory": "build_model", "kwargs": {}}  # fmt: skip
    never_used = run_job(job, workdir / "never-used")
    assert_ok(never_used)
    assert "DDP runs with find_unused_parameters=True" in never_used.stdout

    # Every parameter is used at steps 1-2, `extra` not from step 3 on: step 1 cannot tell.
    job["model"]["kwargs"] = {"extra_until": 2, "with_never": False}
    done = run_job(job, workdir / "stops-being-used")
    assert done.returncode != 0
    assert "set find_unused_parameters=True in the TrainingConfig" in done.stdout + done.stderr
    job["config"]["find_unused_parameters"] = True
    assert_ok(run_job(job, workdir / "stops-being-used-allowed"))
