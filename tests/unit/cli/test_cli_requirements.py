"""A job file's packages (issue 28): ``requirements:`` at the top of a job or search file is
``training.requirements`` (overridable as ``requirements=[...]``), both set is refused; and
``ace3 jobs show`` / ``ace3 environments show`` print the job's phase and environment. Fast: the
client is faked, no stack."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ace3.cli import environments, jobs, main
from ace3.cli.errors import BAD_INPUT, CLIError
from ace3.cli.jobfile import load_job_file, load_search_file
from ace3.client.types import Environment, Job

JOB = """\
model: model.py
dataset: data/train.npz
requirements:
  - einops>=0.8
  - torchvision==0.28.*
training: {epochs: 1}
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "model.py").write_text("def build_model(): ...\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.npz").write_bytes(b"x")
    (tmp_path / "job.yaml").write_text(JOB)
    return tmp_path


def test_the_requirements_key_is_the_configs_requirements(folder: Path) -> None:
    job = load_job_file(folder / "job.yaml", [])
    assert job.training.requirements == ["einops>=0.8", "torchvision==0.28.*"]
    assert job.training.epochs == 1
    overridden = load_job_file(folder / "job.yaml", ["requirements=[timm]"])
    assert overridden.training.requirements == ["timm"]
    (folder / "nested.yaml").write_text(
        "model: model.py\ndataset: data/train.npz\ntraining: {requirements: [einops]}\n"
    )
    assert load_job_file(folder / "nested.yaml", []).training.requirements == ["einops"]
    (folder / "search.yaml").write_text(
        JOB + "search: {max_trials: 2, search_space: "
        "{learning_rate: {type: loguniform, low: 1.0e-4, high: 1.0e-2}}}\n"
    )
    search = load_search_file(folder / "search.yaml", [])
    assert search.hp_config is not None
    assert search.hp_config.base_config.requirements == ["einops>=0.8", "torchvision==0.28.*"]


def test_both_keys_set_is_refused(folder: Path) -> None:
    with pytest.raises(CLIError) as caught:
        load_job_file(folder / "job.yaml", ["training.requirements=[timm]"])
    assert caught.value.code == BAD_INPUT
    assert "requirements: and training.requirements:" in str(caught.value)


def test_a_list_is_needed(folder: Path) -> None:
    with pytest.raises(CLIError) as caught:
        load_job_file(folder / "job.yaml", ["requirements=einops"])
    assert "training.requirements" in str(caught.value)


class _FakeClient:
    def __init__(self, job: Job, environment: Environment) -> None:
        self.jobs = SimpleNamespace(retrieve=lambda job_id: job)
        self.environments = SimpleNamespace(get=lambda env_hash: environment)


def _objects() -> tuple[Job, Environment]:
    env_hash = "ab" * 32
    job = Job.model_validate(
        {
            "id": "job_1", "state": "starting", "phase": "preparing_environment",
            "requirements": ["einops>=0.8"],
            "environment": {"hash": env_hash, "state": "building", "packages": []},
        }
    )  # fmt: skip
    environment = Environment.model_validate(
        {
            "hash": env_hash, "state": "ready", "requirements": ["einops>=0.8"],
            "packages": [{"name": "einops", "version": "0.8.1"}], "python": "3.11.9",
            "platform": "linux_x86_64", "size_bytes": 2048, "build_seconds": 1.25,
            "created_at": datetime(2026, 1, 1, tzinfo=UTC),
        }
    )  # fmt: skip
    return job, environment


def test_jobs_show_and_environments_show_print_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    job, environment = _objects()
    fake: Any = _FakeClient(job, environment)
    monkeypatch.setattr(jobs, "make_client", lambda: fake)
    monkeypatch.setattr(environments, "make_client", lambda: fake)
    assert main(["jobs", "show", "job_1"]) == 0
    shown = capsys.readouterr().out
    assert "preparing_environment" in shown and "einops>=0.8" in shown
    assert f"{environment.hash} (building)" in shown
    assert main(["environments", "show", environment.hash]) == 0
    shown = capsys.readouterr().out
    assert "einops" in shown and "0.8.1" in shown and "2048 bytes" in shown
    assert "linux_x86_64" in shown and "3.11.9" in shown
    assert main(["environments", "show", environment.hash, "--json"]) == 0
    assert '"version": "0.8.1"' in capsys.readouterr().out
