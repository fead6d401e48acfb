"""Every user verb of the ``ace3`` command against the real stack: a YAML job with overrides
followed to success, a detached job inspected with jobs show/logs/metrics/list/download, a
running job cancelled, a two-trial search with searches list/show, workers, and the exit code
of an unknown id. Jobs are tiny (digits, 1 epoch) and run side by side in the stack's 2 slots."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from ace3.cli import main
from tests.conftest import DigitsFiles, Stack

JOB = """\
name: cli-job
model: {path: model.py, kwargs: {hidden: 32}}
dataset: data/train.npz
validation_dataset: data/val.npz
training:
  epochs: 1
  batch_size: 128
  log_interval: 2
"""

SEARCH = """\
name: cli-search
model: model.py
dataset: data/train.npz
validation_dataset: data/val.npz
training: {epochs: 1, batch_size: 256}
search:
  algorithm: random
  max_trials: 2
  parallel_trials: 2
  objective: val_loss
  direction: minimize
  search_space:
    learning_rate: {type: loguniform, low: 1.0e-3, high: 1.0e-2}
"""


class CLI:
    """Runs ``ace3`` in this process (``ace3.cli.main``: no interpreter start per verb) with
    the stack's URL and a key of its own in the environment, from a folder of its own."""

    def __init__(self, stack: Stack, key: str, folder: Path):
        self.env = {"ACE3_API_KEY": key, "ACE3_BASE_URL": stack.base_url}
        self.folder = folder

    def call(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with (
            mock.patch.dict(os.environ, self.env),
            contextlib.chdir(self.folder),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            code = main(list(args))
        return code, out.getvalue(), err.getvalue()

    def run(self, *args: str, code: int = 0) -> str:
        returned, out, err = self.call(*args)
        assert returned == code, (args, returned, out, err)
        return out

    def json(self, *args: str, code: int = 0) -> Any:
        return json.loads(self.run(*args, "--json", code=code))

    def wait_for_state(self, job_id: str, states: set[str], timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.json("jobs", "show", job_id)
            if job["state"] in states:
                return job
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} never reached {states}: {job}")


@pytest.fixture(scope="module")
def cli(stack: Stack, digits_files: DigitsFiles, tmp_path_factory: pytest.TempPathFactory) -> CLI:
    folder = tmp_path_factory.mktemp("cli")
    shutil.copy(digits_files.model, folder / "model.py")
    (folder / "data").mkdir()
    shutil.copy(digits_files.train, folder / "data" / "train.npz")
    shutil.copy(digits_files.validation, folder / "data" / "val.npz")
    (folder / "job.yaml").write_text(JOB)
    (folder / "search.yaml").write_text(SEARCH)
    key, _ = stack.create_key("cli-user")
    return CLI(stack, key, folder)


@pytest.fixture(scope="module")
def detached(cli: CLI) -> str:
    """A job submitted with --detach: its id, printed alone."""
    out = cli.run(
        "train", "job.yaml", "name=cli-detached", "training.tensorboard.log_dir=artifact://tb",
        "--detach",
    )  # fmt: skip
    job_id = out.strip()
    assert job_id and len(out.splitlines()) == 1, out
    return job_id


def test_train_follows_a_yaml_job_with_overrides_to_success(cli: CLI, detached: str) -> None:
    out = cli.run(
        "train", "job.yaml", "training.learning_rate=3e-3", "model.kwargs.hidden=16",
        "name=cli-followed",
    )  # fmt: skip
    assert "succeeded" in out, out
    found = re.search(r"^job (\w+) succeeded$", out, re.MULTILINE)
    assert found, out
    job_id = found.group(1)
    job = cli.json("jobs", "show", job_id)
    assert job["state"] == "succeeded" and job["name"] == "cli-followed"
    assert job["config"]["learning_rate"] == 3e-3 and job["config"]["epochs"] == 1
    assert job["model_kwargs"] == {"hidden": 16}
    assert job["validation_dataset_id"]


def test_a_detached_job_is_inspected_with_the_jobs_verbs(
    cli: CLI, detached: str, tmp_path: Path
) -> None:
    out = cli.run("jobs", "logs", detached, "-f", "--rank", "0")  # returns when the job ends
    assert out.strip() and all(line.startswith("[rank 0] ") for line in out.splitlines())

    job = cli.json("jobs", "show", detached)
    assert job["state"] == "succeeded" and job["name"] == "cli-detached"
    shown = cli.run("jobs", "show", detached)
    assert "cli-detached" in shown and "batch_size" in shown and "optimizer" not in shown
    logs = cli.json("jobs", "logs", detached)
    assert logs and {"seq", "rank", "line"} <= set(logs[0])
    metrics = cli.json("jobs", "metrics", detached, "--name", "train_loss")
    assert metrics and {m["name"] for m in metrics} == {"train_loss"}
    assert "train_loss" in cli.run("jobs", "metrics", detached)
    listed = cli.json("jobs", "list", "--state", "succeeded", "--limit", "50")
    assert detached in [item["id"] for item in listed]
    assert detached in cli.run("jobs", "list")

    downloaded = cli.json("jobs", "download", detached, "-o", f"{tmp_path}/ckpt/")
    path = Path(downloaded["path"])
    assert path.parent == tmp_path / "ckpt" and path.stat().st_size > 0
    assert path.name == downloaded["checkpoint"]["name"]
    cli.run("jobs", "download", detached, "--checkpoint", "no-such", code=3)

    # every artifact (its TensorBoard files), under their relative paths
    every = cli.json("jobs", "download", detached, "--artifacts", "-o", f"{tmp_path}/art")
    paths = [Path(p) for p in every["paths"]]
    assert paths and all(tmp_path / "art" / "tb" in p.parents for p in paths), paths
    assert all(p.stat().st_size > 0 for p in paths)
    assert cli.run("jobs", "download", detached, "--prefix", "no-such", "-o", f"{tmp_path}/n").strip() == (
        f"job {detached} has no artifacts under 'no-such'"
    )  # fmt: skip


def test_jobs_cancel_stops_a_running_job(cli: CLI) -> None:
    job_id = cli.run("train", "job.yaml", "training.epochs=1000", "--detach").strip()
    cli.wait_for_state(job_id, {"running"})
    assert cli.json("jobs", "cancel", job_id)["state"] in {"cancelling", "cancelled"}
    assert cli.wait_for_state(job_id, {"cancelled", "failed", "succeeded"})["state"] == "cancelled"
    # Following a cancelled job's logs ends at once with the exit code of a job that did not succeed.
    cli.run("jobs", "logs", job_id, "-f", code=1)


def test_search_runs_a_yaml_search_and_searches_show_it(cli: CLI) -> None:
    search = cli.json("search", "search.yaml", "training.learning_rate=5e-3")
    assert search["state"] == "succeeded" and search["trials_succeeded"] == 2
    assert search["config"]["base_config"]["batch_size"] == 256
    listed = cli.json("searches", "list")
    assert search["id"] in [item["id"] for item in listed]
    shown = cli.json("searches", "show", search["id"])
    assert len(shown["trials"]) == 2 and shown["best_trial"]["value"] is not None
    assert "learning_rate" in cli.run("searches", "show", search["id"])


def test_workers_lists_the_stacks_worker(cli: CLI, stack: Stack) -> None:
    workers = cli.json("workers")
    assert any(w["queue"] == stack.env["ACE3_QUEUE_NAME"] for w in workers)
    assert "cpu" in cli.run("workers")


def test_an_unknown_id_exits_3(cli: CLI) -> None:
    for verb in (("jobs", "show"), ("jobs", "logs"), ("jobs", "cancel"), ("searches", "show")):
        code, out, err = cli.call(*verb, "job_doesnotexist")
        assert code == 3, (verb, out, err)
        assert err.startswith("ace3: not found") and out == ""


def test_a_failing_job_exits_1_and_a_detached_search_is_cancelled(cli: CLI) -> None:
    (cli.folder / "broken.py").write_text(
        "def build_model():\n    raise RuntimeError('this model cannot be built')\n"
    )
    code, out, err = cli.call("train", "job.yaml", "model=broken.py", "name=cli-broken")
    assert code == 1, (out, err)
    failed = cli.json("jobs", "list", "--state", "failed")
    assert "cli-broken" in [item["name"] for item in failed]

    search_id = cli.run(
        "search", "search.yaml", "name=cli-cancelled", "search.max_trials=20", "--detach"
    ).strip()
    assert search_id and len(search_id.splitlines()) == 1
    cancelled = cli.json("searches", "cancel", search_id)
    assert cancelled["id"] == search_id and cancelled["cancel_requested"] is True
    deadline = time.monotonic() + 60
    while cli.json("searches", "show", search_id)["state"] != "cancelled":
        assert time.monotonic() < deadline, "the search was never cancelled"
        time.sleep(0.5)
