"""``ace3 train job.yaml --detach`` with a ``requirements:`` key, through the real CLI and an
in-process API (no worker reads its queue): the job stores them and ``ace3 jobs show`` prints
them; a URL entry is exit code 2 with the service's 422 naming it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from unittest import mock

import pytest

from ace3.cli import main
from ace3.cli.errors import BAD_INPUT
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Owner
from ace3_control.settings import Settings
from tests.integration.server.in_process_api import add_key, serve


class API(NamedTuple):
    base_url: str
    key: str


@pytest.fixture(scope="module")
def api(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[API]:
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        owner = Owner(name="cli-requirements")
        session.add(owner)
        session.commit()
        key, _ = add_key(session, owner.id)
    engine.dispose()
    settings = Settings(
        data_dir=Path(tmp_path_factory.mktemp("cli-requirements")),
        database_url=database_url,
        broker_url=redis_url,
        queue_name=f"ace3-cli-requirements-{secrets.token_hex(4)}",  # no worker reads it
    )
    with serve(settings) as (_, base_url):
        yield API(base_url, key)


def _ace3(api: API, cwd: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = {"ACE3_API_KEY": api.key, "ACE3_BASE_URL": api.base_url, "COLUMNS": "200"}
    with (
        mock.patch.dict(os.environ, env),
        contextlib.chdir(cwd),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "model.py").write_text("def build_model():\n    return None\n")
    (tmp_path / "train.csv").write_text("x,y\n1,0\n")
    (tmp_path / "job.yaml").write_text(
        "model: model.py\ndataset: train.csv\nrequirements: ['Einops>=0.8', 'tqdm']\n"
    )
    return tmp_path


def test_the_job_files_requirements_reach_the_job(api: API, folder: Path) -> None:
    code, out, err = _ace3(api, folder, "train", "job.yaml", "--detach", "--json")
    assert code == 0, (out, err)
    job = json.loads(out)
    assert job["config"]["requirements"] == ["Einops>=0.8", "tqdm"]
    assert job["requirements"] == ["einops>=0.8", "tqdm"]
    code, out, err = _ace3(api, folder, "jobs", "show", job["id"])
    assert code == 0, (out, err)
    assert "einops>=0.8, tqdm" in out


def test_a_url_entry_is_refused_by_the_service_naming_it(api: API, folder: Path) -> None:
    entry = "einops @ https://example.com/einops-0.8.whl"
    code, out, err = _ace3(
        api, folder, "train", "job.yaml", f"requirements=['{entry}']", "--detach"
    )
    assert code == BAD_INPUT, (out, err)
    assert entry in err and "direct URLs are not accepted" in err
