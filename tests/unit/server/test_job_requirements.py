"""The checks of a job's packages at submission (``services.job_requirements``), a package's
``requirements.txt`` read at upload, and a search trial's merge: fast, no database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from ace3.hp import HPConfig
from ace3_control.models import Search
from ace3_control.worker_registry import advertised_packages
from ace3_server.searches.trial_start import trial_job
from ace3_server.services.job_requirements import (
    check_requirements,
    read_package_requirements,
    replaced_package,
)

LOC: list[str | int] = ["body", "config"]
WORKER = {"torch": "2.13.0+cpu", "numpy": "2.2.1", "packaging": "26.0"}


def test_the_config_and_the_package_are_merged_into_one_canonical_list() -> None:
    check = check_requirements(["tqdm", "Einops[b]>=0.8"], ["einops[a]>=0.8", "foo_bar"], LOC)
    assert check.problems == []
    assert check.merged == ["einops[a,b]>=0.8", "foo-bar", "tqdm"]
    assert check_requirements([], None, LOC).merged == []


def test_a_bad_config_entry_is_named_with_its_index() -> None:
    check = check_requirements(["numpy", "pkg @ file:///tmp/pkg.whl"], None, LOC)
    [problem] = check.problems
    assert problem["loc"] == ["body", "config", "requirements", 1]
    assert "'pkg @ file:///tmp/pkg.whl'" in problem["msg"] and check.merged == []


def test_a_conflict_names_both_entries_and_blames_the_configs() -> None:
    [problem] = check_requirements(["torch>=2"], ["torch==2.13.0"], LOC).problems
    assert problem["loc"] == ["body", "config", "requirements", 0]
    assert (
        "'torch>=2'" in problem["msg"]
        and "requirements.txt entry 'torch==2.13.0'" in (problem["msg"])
    )
    [inside] = check_requirements(["a==1", "A==2"], None, LOC).problems
    assert inside["loc"] == ["body", "config", "requirements", 1]


def test_a_replaced_package_is_refused_where_its_entry_came_from() -> None:
    check = check_requirements(["einops"], ["numpy<2"], LOC, [WORKER])
    [problem] = check.problems
    assert problem["loc"] == ["body", "model_id"]
    assert "the model package's requirements.txt entry 'numpy<2'" in problem["msg"]
    assert "2.2.1" in problem["msg"] and check.merged == []


@pytest.mark.parametrize(
    ("entry", "refused"),
    [
        ("torch==2.0.0", True),
        ("torch<2.13", True),
        ("torch>=2.13", False),
        ("torch==2.13.0", False),  # (a local version meets its public one)
        ("torch>=2.14.0rc1", True),
        ("numpy>=2.3.0.dev0", True),
        ("numpy<=2.2.1", False),
        ("einops==0.1", False),  # not installed: the environment adds it
        ("torch==2.0.0; python_version < '3'", False),  # a false marker asks for nothing
        ("torch==2.0.0; python_version >= '3'", True),
    ],
)
def test_what_replaces_a_workers_package(entry: str, refused: bool) -> None:
    reason = replaced_package(Requirement(entry), [WORKER])
    assert (reason is not None) == refused, reason
    if refused:
        assert "never replaces the worker's" in str(reason)


def test_one_worker_that_can_run_it_is_enough_and_none_advertised_accepts() -> None:
    older = {**WORKER, "torch": "2.0.0"}
    assert replaced_package(Requirement("torch==2.0.0"), [WORKER, older]) is None
    assert replaced_package(Requirement("torch==2.0.0"), [WORKER, {"numpy": "1"}]) is None
    assert replaced_package(Requirement("torch==2.0.0"), []) is None
    assert replaced_package(Requirement("torch==2.0.0"), [{"torch": "not-a-version"}]) is None
    refused = replaced_package(Requirement("torch==2.0.0"), [WORKER, {**WORKER, "torch": "2.12"}])
    assert refused is not None and "2.12, 2.13.0+cpu" in refused


def test_workers_that_advertise_nothing_are_left_out() -> None:
    class Row:
        def __init__(self, packages: dict[str, str] | None) -> None:
            self.packages = packages

    rows = [Row(None), Row(WORKER), Row({})]
    assert advertised_packages(rows) == [WORKER]  # type: ignore[arg-type]  # (duck-typed rows)


def test_a_packages_requirements_txt_is_read_at_its_root(tmp_path: Path) -> None:
    (tmp_path / "mypkg").mkdir()
    assert read_package_requirements(tmp_path, "mypkg.model") is None
    (tmp_path / "mypkg" / "requirements.txt").write_text("tqdm\n")  # a packed package dir
    assert read_package_requirements(tmp_path, "mypkg.model") == ["tqdm"]
    (tmp_path / "requirements.txt").write_text("\ufeff# top\nEinops >= 0.8 \\\n  , <1\n\n")
    assert read_package_requirements(tmp_path, "mypkg.model") == ["einops<1,>=0.8"]
    (tmp_path / "requirements.txt").write_text("einops\n-r more.txt\n")
    with pytest.raises(ValueError, match=re.escape("requirements.txt entry '-r more.txt'")):
        read_package_requirements(tmp_path, "mypkg.model")
    (tmp_path / "requirements.txt").write_text("einops==1\neinops==2\n")
    with pytest.raises(ValueError, match="einops==1"):
        read_package_requirements(tmp_path, "mypkg.model")
    (tmp_path / "requirements.txt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_package_requirements(tmp_path, "mypkg.model")


def test_a_trials_job_has_its_base_configs_requirements_merged_with_the_package() -> None:
    config = HPConfig.model_validate(
        {
            "search_space": {"learning_rate": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
            "max_trials": 2,
            "base_config": {"requirements": ["tqdm"]},
        }
    )
    search = Search(id="s1", owner_id="o", name="s", model_id="m", dataset_id="d",
                    validation_dataset_id=None, model_kwargs={})  # fmt: skip
    job = trial_job(search, config, 0, {"learning_rate": 1e-3}, 0, (), ["einops>=0.8"])
    assert job.requirements == ["einops>=0.8", "tqdm"]
    plain = HPConfig.model_validate({**config.model_dump(), "base_config": {}})
    assert trial_job(search, plain, 1, {"learning_rate": 1e-3}, 0).requirements is None
