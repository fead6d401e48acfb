"""Deleting uploaded weights (``DELETE /v1/checkpoints/{id}``) through the real API over Postgres,
with the SDK and the CLI: the owner's only (404 for another owner, and for a job's checkpoint),
refused with a 409 naming every unfinished job that starts or distils from them, and once
allowed the stored bytes leave the store and the id no longer starts a job. Models, datasets
and weights an unfinished search names are refused likewise.

An API and a database of its own: the jobs here are rows that must stay queued and running,
which the session's worker and reconciler would otherwise claim or re-queue."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

import ace3
from ace3.cli import main as cli_main
from ace3.errors import ConflictError, NotFoundError
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobCheckpoint, JobState, Owner, Search, SearchState
from ace3_control.settings import Settings
from ace3_control.storage import open_store
from tests.conftest import fresh_database, insert_job
from tests.integration.server.in_process_api import add_key, serve


def _safetensors(values: int) -> bytes:
    """A safetensors file of one F32 tensor (written by hand: the server reads it without
    torch)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [values], "data_offsets": [0, 4 * values]}})
    return len(header).to_bytes(8, "little") + header.encode() + bytes(4 * values)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[dict[str, Any]]:
    with fresh_database() as database_url:
        settings = Settings(
            data_dir=tmp_path_factory.mktemp("weights-delete"),
            database_url=database_url,
            broker_url=redis_url,
        )
        engine = make_sync_engine(database_url)
        with serve(settings) as (_app, base_url):
            yield {"settings": settings, "sessions": sync_session_factory(engine), "url": base_url}
        engine.dispose()


def _cli(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """``ace3 <args>`` run in this process with ``env``: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, env),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = cli_main(list(args))
    return code, out.getvalue(), err.getvalue()


def _job(session: Session, template: Job, state: JobState, config: dict[str, Any]) -> str:
    job = Job(
        owner_id=template.owner_id,
        model_id=template.model_id,
        dataset_id=template.dataset_id,
        config=config,
        model_kwargs={},
        num_processes=1,
        request_hash="h",
        state=state,
    )
    session.add(job)
    session.commit()
    return str(job.id)


def test_uploaded_weights_are_deleted_by_their_owner_once_no_unfinished_job_uses_them(
    api: dict[str, Any], tmp_path: Path
) -> None:
    with api["sessions"]() as session:
        template = insert_job(session, state=JobState.SUCCEEDED)
        owner_key, _ = add_key(session, template.owner_id)
        other = Owner(name="weights-stranger")
        session.add(other)
        session.commit()
        stranger_key, _ = add_key(session, other.id)
        job_checkpoint = JobCheckpoint(
            job_id=template.id, name="step-1.pt", step=1, attempt=1, sha256="0" * 64,
            size_bytes=1, storage_key="checkpoints/x/step-1.pt", metrics={},
        )  # fmt: skip
        session.add(job_checkpoint)
        session.commit()
    weights_file = tmp_path / "w.safetensors"
    weights_file.write_bytes(_safetensors(3))
    store = open_store(api["settings"])
    owner = ace3.Client(api_key=owner_key, base_url=api["url"])
    stranger = ace3.Client(api_key=stranger_key, base_url=api["url"])

    weights = owner.checkpoints.upload(weights_file)
    key = f"weights/{template.owner_id}/{weights.sha256}/weights.safetensors"
    assert store.exists(key)
    with pytest.raises(NotFoundError):
        stranger.checkpoints.delete(weights.id)
    with pytest.raises(NotFoundError, match="uploaded weights not found"):
        owner.checkpoints.delete(job_checkpoint.id)  # a job's checkpoint: not deleted here

    with api["sessions"]() as session:
        starts = _job(session, template, JobState.QUEUED, {"init_from_checkpoint_id": weights.id})
        teacher = {"distillation": {"teacher_checkpoint_id": weights.id}}
        distils = _job(session, template, JobState.RUNNING, teacher)
        _job(session, template, JobState.FAILED, {"init_from_checkpoint_id": weights.id})
    with pytest.raises(ConflictError) as refused:
        owner.checkpoints.delete(weights)
    assert f"job {starts}" in str(refused.value) and f"job {distils}" in str(refused.value)
    assert "which have not finished" in str(refused.value)
    assert store.exists(key), "nothing deleted"

    with api["sessions"]() as session:
        session.execute(update(Job).where(Job.id == starts).values(state=JobState.CANCELLED))
        session.commit()
    with pytest.raises(ConflictError, match=f"in use by job {distils}, which has not finished"):
        owner.checkpoints.delete(weights.id)
    with api["sessions"]() as session:
        session.execute(update(Job).where(Job.id == distils).values(state=JobState.SUCCEEDED))
        session.commit()

    env = {"ACE3_API_KEY": owner_key, "ACE3_BASE_URL": api["url"]}
    code, out, err = _cli(env, "checkpoints", "delete", weights.id)
    assert code == 0, err
    assert out.strip() == f"uploaded weights {weights.id}: deleted"
    assert not store.exists(key), "the bytes left the store"
    with pytest.raises(NotFoundError):
        owner.checkpoints.download(weights.id, tmp_path / "copy.safetensors")
    code, _, err = _cli(env, "checkpoints", "delete", weights.id)
    assert code == 3 and "uploaded weights not found" in err

    # The id no longer starts a job.
    ids = {"model_id": template.model_id, "dataset_id": template.dataset_id}
    with pytest.raises(ace3.errors.ValidationError, match="init_from_checkpoint_id"):
        owner.jobs.create(**ids, config={"init_from_checkpoint_id": weights.id})
    # The same bytes uploaded again bring the weights back, under the same id.
    revived = owner.checkpoints.upload(weights_file)
    assert revived.id == weights.id and store.exists(key)


def test_what_an_unfinished_search_names_is_not_deleted_until_it_finishes(
    api: dict[str, Any], tmp_path: Path
) -> None:
    """A search's trials' jobs are made later, from the search's row: its model, datasets and
    the weights its base_config starts or distils from stay while it has not finished."""
    with api["sessions"]() as session:
        template = insert_job(session, state=JobState.SUCCEEDED)
        owner_key, _ = add_key(session, template.owner_id)
    owner = ace3.Client(api_key=owner_key, base_url=api["url"])
    weights_file = tmp_path / "w.safetensors"
    weights_file.write_bytes(_safetensors(5))
    weights = owner.checkpoints.upload(weights_file)
    teacher_weights_file = tmp_path / "teacher.safetensors"
    teacher_weights_file.write_bytes(_safetensors(7))
    teacher_weights = owner.checkpoints.upload(teacher_weights_file)
    base = {
        "init_from_checkpoint_id": weights.id,
        "distillation": {"teacher_checkpoint_id": teacher_weights.id},
    }
    with api["sessions"]() as session:
        search = Search(
            owner_id=template.owner_id, model_id=template.model_id,
            dataset_id=template.dataset_id, validation_dataset_id=template.dataset_id,
            config={"search_space": {}, "base_config": base}, model_kwargs={},
            request_hash="h", state=SearchState.QUEUED,
        )  # fmt: skip
        session.add(search)
        session.commit()
        search_id = search.id

    refusal = f"in use by search {search_id}, which has not finished; cancel it first"
    for delete in (
        lambda: owner.models.delete(template.model_id),
        lambda: owner.datasets.delete(template.dataset_id),
        lambda: owner.checkpoints.delete(weights.id),
        lambda: owner.checkpoints.delete(teacher_weights.id),
    ):
        with pytest.raises(ConflictError, match=refusal):
            delete()

    with api["sessions"]() as session:
        session.execute(
            update(Search).where(Search.id == search_id).values(state=SearchState.CANCELLED)
        )
        session.commit()
    owner.checkpoints.delete(weights.id)
    owner.checkpoints.delete(teacher_weights.id)
    owner.models.delete(template.model_id)
    owner.datasets.delete(template.dataset_id)
    with pytest.raises(NotFoundError):
        owner.models.retrieve(template.model_id)
