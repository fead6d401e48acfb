"""Per-job environments end to end through the SDK (docs/environments.md): real API, Postgres,
Redis, the Celery worker, uv and the sandbox, with wheels the test writes into the stack's
wheelhouse (``ACE3_PIP_FIND_LINKS``, offline: no index, no network).

A model imports a package only its environment holds: the first job builds the environment,
the next one with the same requirements (spelled differently) reuses it from the worker's
cache; inside the job the environment is read-only and comes after the worker's own packages.
A model package's requirements.txt is honoured; a package the wheelhouse lacks fails the job
with the resolver's words, without a retry; a URL or a replacement for the worker's torch is
refused at submission.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

import ace3
from tests.conftest import DigitsFiles, Stack
from tests.wheelhouse import make_wheel

pytestmark = pytest.mark.slow

# The model checks, inside the job, where its package came from and what it may do to it.
MODEL_FILE = """
import os
import sys

import {package}
from torch import nn


def build_model():
    where = os.path.dirname({package}.__file__)
    worker_packages = os.path.dirname(os.path.dirname(os.path.dirname(nn.__file__)))
    entries = [os.path.realpath(entry) for entry in sys.path]
    worker = entries.index(os.path.realpath(worker_packages))
    added = entries.index(os.path.realpath(os.path.dirname(where)))
    if added < worker:
        raise RuntimeError(f"the environment {{where}} comes before the worker's packages")
    try:
        with open(os.path.join(where, "planted.py"), "w") as planted:
            planted.write("x = 1")
    except OSError as exc:
        print(f"environment is read-only: {{type(exc).__name__}}", flush=True)
    else:
        raise RuntimeError(f"the job could write into its environment at {{where}}")
    return nn.Sequential(nn.Linear(64, {package}.WIDTH), nn.ReLU(), nn.Linear({package}.WIDTH, 10))
"""


def _service_lines(client: ace3.Client, job_id: str) -> list[str]:
    return [line.line for line in client.jobs.iter_logs(job_id) if line.stream == "service"]


@pytest.fixture(scope="module")
def package(stack: Stack) -> str:
    """A package of a name no other test uses (environments outlive a test), and its
    dependency, as wheels in the stack's wheelhouse."""
    name = f"envpkg_{secrets.token_hex(3)}"
    wheelhouse = stack.root / "wheelhouse"
    make_wheel(wheelhouse, f"{name}-dep", "1.2", {f"{name}_dep/__init__.py": "DEPTH = 2\n"})
    make_wheel(
        wheelhouse,
        name,
        "1.0",
        {f"{name}/__init__.py": f"from {name}_dep import DEPTH\nWIDTH = 16 * DEPTH\n"},
        requires=[f"{name}-dep>=1"],
    )
    return name


def _train(client: ace3.Client, model: ace3.Model, digits: DigitsFiles, requirements: list[str]):
    config = ace3.TrainingConfig(batch_size=64, max_steps=2, requirements=requirements)
    return ace3.Trainer(config).train(
        model, client.load_dataset(digits.train), epochs=1, show_progress=False
    )


def test_a_job_imports_its_environment_and_the_next_one_reuses_it(
    client: ace3.Client, digits_files: DigitsFiles, package: str, tmp_path: Path
) -> None:
    model_file = tmp_path / "model.py"
    model_file.write_text(MODEL_FILE.format(package=package))
    model = client.load_model(model_file)

    first = client.jobs.retrieve(_train(client, model, digits_files, [f"{package}==1.0"]).job_id)
    assert first.state == "succeeded"
    assert first.requirements == [f"{package.replace('_', '-')}==1.0"]
    assert first.environment is not None
    added = {(item.name, item.version) for item in first.environment.packages}
    assert added == {
        (package.replace("_", "-"), "1.0"),
        (f"{package}-dep".replace("_", "-"), "1.2"),
    }
    lines = _service_lines(client, first.id)
    assert any(f"environment {first.environment.hash[:12]}: built" in line for line in lines), lines
    logs = [line.line for line in client.jobs.iter_logs(first.id)]
    assert any("environment is read-only" in line for line in logs), logs[-20:]

    # The same set spelled another way: the same environment, from the worker's cache.
    second = client.jobs.retrieve(
        _train(client, model, digits_files, [f"{package.upper()} == 1.0"]).job_id
    )
    assert second.state == "succeeded" and second.phase is None
    assert second.environment is not None and second.environment.hash == first.environment.hash
    lines = _service_lines(client, second.id)
    assert any("reused from the cache" in line for line in lines), lines
    assert not any(": built" in line for line in lines), lines

    shown = client.environments.get(first.environment.hash)
    assert shown.state == "ready" and {p.name for p in shown.packages} == {
        name for name, _ in added
    }


def test_a_model_packages_requirements_txt_is_honoured(
    client: ace3.Client, digits_files: DigitsFiles, package: str, tmp_path: Path
) -> None:
    root = tmp_path / "pkg"
    (root / "mymodel").mkdir(parents=True)
    (root / "mymodel" / "__init__.py").write_text("")
    (root / "mymodel" / "model.py").write_text(MODEL_FILE.format(package=package))
    (root / "requirements.txt").write_text(f"# what the model imports\n{package}>=1.0\n")
    model = client.load_model(root, entry_module="mymodel.model")
    result = _train(client, model, digits_files, [])
    job = client.jobs.retrieve(result.job_id)
    assert job.state == "succeeded"
    assert job.requirements == [f"{package.replace('_', '-')}>=1.0"]


def test_a_package_the_wheelhouse_lacks_fails_the_job_naming_it(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    model_file = tmp_path / "model.py"
    model_file.write_text(
        "from torch import nn\n\ndef build_model():\n    return nn.Linear(64, 10)\n"
    )
    missing = f"nowhere-{secrets.token_hex(3)}"
    with pytest.raises(ace3.JobFailedError) as failure:
        _train(client, client.load_model(model_file), digits_files, [f"{missing}>=1"])
    job = failure.value.job
    assert job.state == "failed" and job.attempt == 1, "a failed build is not retried"
    assert missing in (job.error or "") and "not found" in (job.error or ""), job.error


def test_urls_and_a_replacement_torch_are_refused_at_submission(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    import torch

    model_file = tmp_path / "model.py"
    model_file.write_text(
        "from torch import nn\n\ndef build_model():\n    return nn.Linear(64, 10)\n"
    )
    model = client.load_model(model_file)
    with pytest.raises(ace3.errors.ValidationError, match="direct URLs"):
        _train(client, model, digits_files, ["tool @ https://example.com/tool-1.0.whl"])
    other = "2.0.0" if not torch.__version__.startswith("2.0.0") else "2.1.0"
    with pytest.raises(ace3.errors.ValidationError, match="torch"):
        _train(client, model, digits_files, [f"torch=={other}"])
