"""``ace3 datasets upload DIR --format F`` through the real CLI and an in-process API on the local
store: a directory of jsonl shards becomes a "shards" dataset printed like ``show``; the same
directory again is the same dataset (nothing uploaded); a directory with one more shard stores
only that one; ``--json``; a bad ``--column``, a directory without shards and an option the
service refuses are exit code 2, saying why. No worker runs."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from unittest import mock

import pytest

from ace3.cli import main
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Owner
from ace3_control.settings import Settings
from tests.integration.server.in_process_api import add_key, serve
from tests.shard_sources import jsonl_bytes


class API(NamedTuple):
    base_url: str
    key: str
    owner_id: str
    storage: Path


@pytest.fixture(scope="module")
def api(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[API]:
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        owner = Owner(name="cli-upload")
        session.add(owner)
        session.commit()
        key, _ = add_key(session, owner.id)
        owner_id = owner.id
    engine.dispose()
    data_dir = Path(tmp_path_factory.mktemp("cli-upload"))
    settings = Settings(
        data_dir=data_dir,
        database_url=database_url,
        broker_url=redis_url,
        queue_name=f"ace3-cli-upload-{secrets.token_hex(4)}",  # no worker reads it
    )
    with serve(settings) as (_, base_url):
        yield API(base_url, key, owner_id, data_dir / "storage")


def _ace3(api: API, cwd: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    env = {"ACE3_API_KEY": api.key, "ACE3_BASE_URL": api.base_url, "COLUMNS": "200"}
    with (
        mock.patch.dict(os.environ, env),
        contextlib.chdir(cwd),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = main(list(args))
        except SystemExit as exc:  # (argparse's usage errors)
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _shown(out: str) -> tuple[str, str, dict[str, str]]:
    """(id, state, fields) of what ``show``'s table printed."""
    title = re.search(r"dataset (\w+) \(([\w ]+)\)", out)
    assert title is not None, out
    rows = (re.fullmatch(r"\W*(\w+)\s+│\s+(.*?)\s*│?", line) for line in out.splitlines())
    return title[1], title[2], {row[1]: row[2] for row in rows if row is not None}


def _stored(api: API) -> set[str]:
    return {p.name for p in (api.storage / "datasets" / api.owner_id / "shards").iterdir()}


def test_a_directory_of_shards_is_uploaded_once_and_resumes(api: API, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "part").mkdir(parents=True)
    (corpus / "part" / "0.jsonl").write_bytes(jsonl_bytes(3))
    (corpus / "part" / "1.jsonl").write_bytes(jsonl_bytes(5))
    (corpus / "notes.txt").write_text("not a shard")

    code, out, err = _ace3(api, tmp_path, "datasets", "upload", "corpus", "--format", "jsonl")
    assert code == 0, (out, err)
    dataset_id, state, fields = _shown(out)
    assert state == "uploaded"
    assert fields == {
        "name": "corpus",
        "kind": "shards",
        "uri": "-",
        "format": "jsonl",
        "shards": "2",
        "bytes": str(len(jsonl_bytes(3)) + len(jsonl_bytes(5))),
        "samples": "unknown",
        "records": "-",
        "sha256": fields["sha256"],
        "created": fields["created"],
    }
    assert len(_stored(api)) == 2

    code, out, err = _ace3(api, tmp_path, "datasets", "upload", "corpus", "--format", "jsonl")
    assert code == 0, (out, err)
    assert _shown(out)[:2] == (dataset_id, "already uploaded")

    # One more shard: a new dataset, and only the new shard is stored.
    (corpus / "part" / "2.jsonl").write_bytes(jsonl_bytes(7))
    code, out, err = _ace3(
        api, tmp_path, "datasets", "upload", str(corpus), "--format", "jsonl",
        "--name", "corpus-3", "--json",
    )  # fmt: skip
    assert code == 0, (out, err)
    dataset = json.loads(out)
    assert dataset["id"] != dataset_id and dataset["name"] == "corpus-3"
    assert (dataset["kind"], dataset["shard_count"]) == ("shards", 3)
    assert len(_stored(api)) == 3

    code, out, err = _ace3(api, tmp_path, "datasets", "show", dataset["id"], "--json")
    assert code == 0 and json.loads(out)["sha256"] == dataset["sha256"]


def test_bad_input_is_exit_code_2_saying_why(api: API, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("x")
    code, _, err = _ace3(api, tmp_path, "datasets", "upload", "empty", "--format", "parquet")
    assert code == 2 and "holds no parquet shards" in err

    code, _, err = _ace3(
        api, tmp_path, "datasets", "upload", "empty", "--format", "parquet", "--column", "x=y"
    )
    assert code == 2 and "--column 'x=y': expected inputs=<column> or targets=<column>" in err

    code, _, err = _ace3(api, tmp_path, "datasets", "upload", "missing", "--format", "jsonl")
    assert code == 2 and "missing" in err

    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "0.jsonl").write_bytes(jsonl_bytes(2))
    code, _, err = _ace3(
        api, tmp_path, "datasets", "upload", "one", "--format", "jsonl", "--dtype", "uint32"
    )
    assert code == 2 and "dtype" in err, err
