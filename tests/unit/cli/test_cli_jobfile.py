"""YAML job and search files with key=value overrides (ace3.cli.jobfile), and the messages and
exit codes of bad input: fast, no stack."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ace3.cli import main
from ace3.cli.dataset_entries import DatasetById
from ace3.cli.errors import BAD_INPUT, CLIError
from ace3.cli.jobfile import load_job_file, load_search_file

JOB = """\
name: tiny
model: model.py
dataset: data/train.npz
training:
  epochs: 1
  learning_rate: 1.0e-3
"""

SEARCH = """\
model: {path: model.py, kwargs: {hidden: 16}}
dataset: data/train.npz
training: {epochs: 1}
search:
  algorithm: random
  max_trials: 2
  objective: val_loss
  direction: minimize
  search_space:
    learning_rate: {type: loguniform, low: 1.0e-4, high: 1.0e-2}
    model.hidden: {type: choice, options: [16, 32]}
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "model.py").write_text("def build_model(): ...\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.npz").write_bytes(b"x")
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "search.yaml").write_text(SEARCH)
    return tmp_path


def _error(folder: Path, overrides: list[str], name: str = "job.yaml") -> str:
    load = load_search_file if name.startswith("search") else load_job_file
    with pytest.raises(CLIError) as caught:
        load(folder / name, overrides)
    assert caught.value.code == BAD_INPUT
    return str(caught.value)


def test_a_job_file_with_overrides_becomes_the_sdk_objects(folder: Path) -> None:
    spec = load_job_file(
        folder / "job.yaml",
        ["training.learning_rate=3e-4", "model.kwargs.hidden=128", "training.batch_size=8"],
    )
    assert spec.name == "tiny"
    assert spec.model.path == str(folder / "model.py")  # relative to the file, not the cwd
    assert spec.model.factory == "build_model" and spec.model.kwargs == {"hidden": 128}
    assert spec.dataset == str(folder / "data" / "train.npz")
    assert spec.training.learning_rate == 3e-4 and spec.training.batch_size == 8
    assert spec.training.epochs == 1


def test_override_paths_resolve_against_the_current_directory(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(folder / "data")
    spec = load_job_file(folder / "job.yaml", ["dataset=train.npz", "model=../model.py"])
    assert spec.dataset == str(folder / "data" / "train.npz")
    assert spec.model.path == str(folder / "model.py")


def test_a_search_file_becomes_an_hpconfig_with_training_as_its_base(folder: Path) -> None:
    spec = load_search_file(folder / "search.yaml", ["search.max_trials=3", "training.epochs=2"])
    hp = spec.hp_config
    assert hp is not None and hp.max_trials == 3 and hp.algorithm == "random"
    assert hp.base_config.epochs == 2 and hp.direction == "minimize"
    assert set(hp.search_space) == {"learning_rate", "model.hidden"}
    assert spec.model.kwargs == {"hidden": 16}


def test_an_unknown_key_is_named_with_the_valid_ones(folder: Path) -> None:
    message = _error(folder, ["training.learnin_rate=0.1"])
    assert "unknown key 'training.learnin_rate'" in message
    assert "did you mean 'learning_rate'" in message and "batch_size" in message
    top = _error(folder, ["modle.kwargs.hidden=3"])
    assert "unknown key 'modle'" in top and "dataset, model, name, training" in top
    nested = _error(folder, ["model.factori=make"])
    assert (
        "unknown key 'model.factori'" in nested and "entry_module, factory, kwargs, path" in nested
    )
    search = _error(folder, ["search.n_trials=3"], "search.yaml")
    assert "unknown key 'search.n_trials'" in search and "max_trials" in search
    assert "base_config" not in search


def test_a_wrong_type_gives_the_field_path_and_pydantics_message(folder: Path) -> None:
    message = _error(folder, ["training.epochs=abc"])
    assert "training.epochs: Input should be a valid integer" in message and "'abc'" in message
    space = _error(folder, ["search.search_space.learning_rate.low=-1"], "search.yaml")
    assert "search.search_space.learning_rate: Value error" in space and "positive bounds" in space
    bad_type = _error(folder, ["search.search_space.learning_rate.type=gaussian"], "search.yaml")
    assert "search.search_space.learning_rate" in bad_type and "loguniform" in bad_type


def test_missing_files_say_which(folder: Path) -> None:
    assert "job file not found" in _error(folder / "nowhere", [])
    (folder / "data" / "train.npz").unlink()
    message = _error(folder, [])
    assert message.startswith("dataset: file not found: ") and "train.npz" in message
    assert str(folder / "job.yaml") in message
    model = _error(folder, ["model=missing.py"])
    assert "model.path: file not found" in model and "command line" in model


def test_a_stored_dataset_is_named_by_its_id(folder: Path) -> None:
    """``dataset: {id: ...}`` (and validation_dataset) is a dataset the service stores: kept as
    an id, no file looked for; ``dataset.id=`` and ``dataset=<path>`` override either form."""
    (folder / "byid.yaml").write_text(
        "model: model.py\ndataset: {id: 0f3a9c}\nvalidation_dataset: {id: val_1-b}\n"
        "training: {epochs: 1}\n"
    )
    spec = load_job_file(folder / "byid.yaml", [])
    assert spec.dataset == DatasetById(id="0f3a9c")
    assert spec.validation_dataset == DatasetById(id="val_1-b")
    spec = load_job_file(folder / "job.yaml", ["dataset.id=abc", "validation_dataset.id=def"])
    assert spec.dataset == DatasetById(id="abc") and spec.validation_dataset == DatasetById(
        id="def"
    )
    spec = load_job_file(folder / "byid.yaml", [f"dataset={folder / 'data' / 'train.npz'}"])
    assert spec.dataset == str(folder / "data" / "train.npz")
    search = load_search_file(folder / "search.yaml", ["dataset.id=abc"])
    assert search.dataset == DatasetById(id="abc") and search.hp_config is not None


def test_a_wrong_dataset_id_entry_names_the_key(folder: Path) -> None:
    unknown = _error(folder, ["dataset.path=x"])
    assert "unknown key 'dataset.path'" in unknown and "{id: <dataset id>}" in unknown
    (folder / "empty.yaml").write_text("model: model.py\ndataset: {}\n")
    assert "dataset.id: required key missing" in _error(folder, [], "empty.yaml")
    number = _error(folder, ["validation_dataset.id=0123"])  # YAML reads 0123 as a number
    assert "validation_dataset.id: a dataset id is a string" in number and "quote it" in number
    assert "'../models' is not a dataset id" in _error(folder, ["dataset.id=../models"])
    assert "dataset: Value error, a path to upload, or {id" in _error(folder, ["dataset=5"])
    assert "not NoneType" in _error(folder, ["dataset="])
    (folder / "empty.yaml").write_text("model: model.py\ndataset: ''\n")
    assert "dataset: Value error, an empty path" in _error(folder, [], "empty.yaml")
    spec = load_job_file(folder / "job.yaml", ["validation_dataset="])
    assert spec.validation_dataset is None


def test_resolvers_are_refused_so_a_shared_file_cannot_read_this_machines_secrets(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """${oc.env:...} and friends, in the file or in an override, are refused naming the key,
    before anything is resolved; plain references to other keys still work."""
    monkeypatch.setenv("ACE3_TEST_SECRET", "hunter2")
    files = {
        "name: ${oc.env:ACE3_TEST_SECRET}\n": "name",
        "validation_dataset: '${oc.decode:${oc.env:ACE3_TEST_SECRET}}'\n": "validation_dataset",
        "name: 'x-${ oc.env:ACE3_TEST_SECRET}'\n": "name",
        "name: '${training.${oc.env:ACE3_TEST_SECRET}}'\n": "name",
    }
    for text, key in files.items():
        (folder / "bad.yaml").write_text(JOB.replace("name: tiny\n", text))
        message = _error(folder, [], "bad.yaml")
        assert f"bad.yaml: {key}: " in message and "resolver" in message, message
        assert "hunter2" not in message
    (folder / "bad.yaml").write_text(
        JOB.replace("model: model.py", "model: {path: model.py, kwargs: {a: [1, '${my:x}']}}")
    )
    assert "model.kwargs.a[1]: " in _error(folder, [], "bad.yaml")
    for override in ("name=${oc.env:ACE3_TEST_SECRET}", "model.kwargs.k='${oc.create:{}}'"):
        message = _error(folder, [override])
        assert message.startswith(f"override {override.split('=')[0]}: "), message
        assert "hunter2" not in message
    spec = load_job_file(folder / "job.yaml", ["name=run-${training.epochs}-${.dataset}"])
    assert spec.name == "run-1-data/train.npz"  # (resolved before the paths are made absolute)


def test_limits_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["jobs", "list", "--limit", "0"])
    assert exited.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_malformed_overrides_and_files_are_refused(folder: Path) -> None:
    assert "is not key=value" in _error(folder, ["learning_rate"])
    (folder / "job.yaml").write_text("- a list\n")
    assert "must be a mapping" in _error(folder, [])
    (folder / "job.yaml").write_text("model: [unclosed\n")
    assert "not valid YAML" in _error(folder, [])
    (folder / "search.yaml").write_text(JOB)
    assert "search: a mapping is required" in _error(folder, [], "search.yaml")


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_command_exits_2_on_bad_input(
    folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(folder)
    monkeypatch.setenv("ACE3_API_KEY", "unused")
    for args, expected in [
        (["train", "job.yaml", "training.learnin_rate=1"], "unknown key 'training.learnin_rate'"),
        (["train", "job.yaml", "training.epochs=abc"], "training.epochs: Input should be"),
        (["train", "missing.yaml"], "job file not found: missing.yaml"),
        (["search", "search.yaml", "search.max_trials=0"], "search.max_trials"),
    ]:
        code, out, err = _main(capsys, *args)
        assert code == 2, (args, err)
        assert err.startswith("ace3: ") and expected in err, err
        assert out == ""


def test_no_key_or_no_service_exits_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import ace3.client._http

    monkeypatch.setattr(ace3.client._http, "_sleep", lambda seconds: None)
    monkeypatch.delenv("ACE3_API_KEY", raising=False)
    code, _, err = _main(capsys, "jobs", "list")
    assert code == 4 and "ACE3_API_KEY" in err
    monkeypatch.setenv("ACE3_API_KEY", "k")
    monkeypatch.setenv("ACE3_BASE_URL", "http://127.0.0.1:9")
    code, out, err = _main(capsys, "workers", "--json")
    assert code == 4 and "cannot reach the ACE3 service" in err and out == ""


def test_python_m_runs_it_with_the_exit_codes_in_its_help(folder: Path) -> None:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("ACE3_")}
    result = subprocess.run(
        [sys.executable, "-m", "ace3.cli", "--help"],
        env=environment, cwd=folder, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0
    assert "3 not found" in " ".join(result.stdout.split())


def test_the_examples_job_and_search_files_are_valid(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parents[3] / "examples" / "digits"
    for name in ("job.yaml", "search.yaml", "model.py"):
        (tmp_path / name).write_text((examples / name).read_text())
    (tmp_path / "data").mkdir()
    for name in ("digits-train.npz", "digits-val.npz"):
        (tmp_path / "data" / name).write_bytes(b"x")
    job = load_job_file(tmp_path / "job.yaml", [])
    assert job.training.num_gpus == 2 and job.model.kwargs["hidden"] == 128
    search = load_search_file(tmp_path / "search.yaml", [])
    assert search.hp_config is not None and "model.hidden" in search.hp_config.search_space
