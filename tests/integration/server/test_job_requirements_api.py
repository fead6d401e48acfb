"""A job's packages through the real API (in process, no worker reads its queue): what
``config.requirements`` refuses (URLs, paths, pip options: a 422 naming the entry, the SDK's
``ValidationError``), a model package's ``requirements.txt`` read at upload and merged into the
job's requirements (two specifiers for one package: a 422 naming both), a requirement that would
replace a package the live workers advertise refused, a search's base config checked the same
way, the job's ``phase`` and ``environment`` in its responses, and ``GET
/v1/environments/{hash}`` shown only to an owner one of whose jobs used it."""

from __future__ import annotations

import io
import secrets
import tarfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from sqlalchemy import delete, update

import ace3
from ace3.errors import ValidationError
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Environment, Job, Worker, utcnow
from ace3_control.settings import Settings
from tests.conftest import insert_job
from tests.integration.server.in_process_api import add_key, serve

MODEL_PY = b"import torch\n\ndef build_model():\n    return torch.nn.Linear(2, 2)\n"


class API(NamedTuple):
    base_url: str
    key: str
    owner: httpx.Client
    other: httpx.Client
    model_id: str  # a .py model (no requirements)
    dataset_id: str
    sessions: Any
    queue: str


@pytest.fixture(scope="module")
def api(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[API]:
    engine = make_sync_engine(database_url)
    sessions = sync_session_factory(engine)
    with sessions() as session:
        job = insert_job(session, state="cancelled")  # an owner with a model and a dataset
        key, _ = add_key(session, job.owner_id)
        other_key, _ = add_key(session, insert_job(session, state="cancelled").owner_id)
        model_id, dataset_id = job.model_id, job.dataset_id
    queue = f"ace3-requirements-{secrets.token_hex(4)}"  # no worker reads it
    settings = Settings(
        data_dir=Path(tmp_path_factory.mktemp("requirements")),
        database_url=database_url,
        broker_url=redis_url,
        queue_name=queue,
    )
    try:
        with (
            serve(settings) as (_, base_url),
            httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}) as owner,
            httpx.Client(
                base_url=base_url, headers={"Authorization": f"Bearer {other_key}"}
            ) as other,
        ):
            yield API(base_url, key, owner, other, model_id, dataset_id, sessions, queue)
    finally:
        engine.dispose()


def _job(api: API, model_id: str | None = None, **config: Any) -> httpx.Response:
    body = {"model_id": model_id or api.model_id, "dataset_id": api.dataset_id, "config": config}
    return api.owner.post("/v1/jobs", json=body)


def _problem(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    return dict(problem)


def _package(api: API, requirements: str) -> httpx.Response:
    """Upload a package archive (``mypkg.model``) with this ``requirements.txt`` at its root."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        files = {
            "mypkg/__init__.py": b"",
            "mypkg/model.py": MODEL_PY,
            "requirements.txt": requirements.encode(),
            "salt.txt": secrets.token_hex(8).encode(),  # new bytes each upload
        }
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return api.owner.post(
        "/v1/models",
        files={"file": ("mypkg.tar.gz", buffer.getvalue())},
        data={"entry_module": "mypkg.model"},
    )


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("einops @ https://example.com/einops-0.8.whl", "direct URLs are not accepted"),
        ("git+https://example.com/repo.git", "direct URLs are not accepted"),
        ("-e .", "pip options"),
        ("--index-url https://example.com/simple", "pip options"),
        ("./vendor/mypkg", "local paths"),
        ("/opt/wheels/einops-0.8.0-py3-none-any.whl", "local paths"),
    ],
)
def test_an_entry_that_is_not_a_named_requirement_is_refused_naming_it(
    api: API, entry: str, reason: str
) -> None:
    problem = _problem(_job(api, requirements=["numpy", entry]))
    assert problem["loc"] == ["body", "config", "requirements", 1]
    assert repr(entry) in problem["msg"] and reason in problem["msg"]


def test_the_sdk_raises_validation_error_naming_the_entry(api: API) -> None:
    entry = "einops @ https://example.com/einops.whl"
    with (
        ace3.Client(api_key=api.key, base_url=api.base_url) as client,
        pytest.raises(ValidationError) as raised,
    ):
        client.jobs.create(
            model_id=api.model_id,
            dataset_id=api.dataset_id,
            config=ace3.TrainingConfig(requirements=[entry]),
        )
    assert entry in str(raised.value) and "requirements" in str(raised.value)


def test_a_packages_requirements_txt_is_stored_and_merged_into_the_job(api: API) -> None:
    uploaded = _package(api, "# pinned\nEinops>=0.8  # for rearrange\nFoo_Bar[b,a]==1.*\n")
    assert uploaded.status_code == 201, uploaded.text
    model = uploaded.json()
    assert model["requirements"] == ["einops>=0.8", "foo-bar[a,b]==1.*"]
    assert (
        api.owner.get(f"/v1/models/{model['id']}").json()["requirements"] == (model["requirements"])
    )
    created = _job(api, model["id"], requirements=["tqdm", "einops>=0.8"])
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["requirements"] == ["einops>=0.8", "foo-bar[a,b]==1.*", "tqdm"]
    assert (job["phase"], job["environment"]) == (None, None)
    plain = _job(api).json()
    assert plain["requirements"] is None  # none asked: None, not []
    conflict = _problem(_job(api, model["id"], requirements=["einops==0.7.0"]))
    assert conflict["loc"] == ["body", "config", "requirements", 0]
    assert "'einops==0.7.0'" in conflict["msg"] and "'einops>=0.8'" in conflict["msg"]
    assert "requirements.txt" in conflict["msg"]


def test_a_bad_requirements_txt_is_refused_at_upload_naming_the_entry(api: API) -> None:
    problem = _problem(_package(api, "einops\n--extra-index-url https://example.com\n"))
    assert problem["loc"] == ["body", "file"]
    assert "requirements.txt" in problem["msg"] and "--extra-index-url" in problem["msg"]
    assert "pip options" in problem["msg"]


@pytest.fixture
def advertising_worker(api: API) -> Iterator[dict[str, str]]:
    """A live worker of the API's queue advertising its installed packages."""
    packages = {"torch": "2.13.0+cpu", "numpy": "2.2.1", "ace3": "1.0.0"}
    with api.sessions() as session:
        worker = Worker(
            hostname="advertiser", pid=1, device_kind="cpu", device_count=8, slots=1,
            queue=api.queue, heartbeat_seconds=3600.0, packages=packages,
        )  # fmt: skip
        session.add(worker)
        session.commit()
        worker_id = worker.id
    yield packages
    with api.sessions() as session:
        session.execute(delete(Worker).where(Worker.id == worker_id))
        session.commit()


def test_a_requirement_replacing_an_advertised_package_is_refused(
    api: API, advertising_worker: dict[str, str]
) -> None:
    problem = _problem(_job(api, requirements=["einops", "torch==2.0.0"]))
    assert problem["loc"] == ["body", "config", "requirements", 1]
    assert "'torch==2.0.0'" in problem["msg"] and "2.13.0+cpu" in problem["msg"]
    assert "never replaces the worker's torch" in problem["msg"]
    for fine in (["torch>=2.13"], ["torch==2.13.0"], ["numpy<3", "einops"]):
        assert _job(api, requirements=fine).status_code == 201, fine
    # a marker that is false here asks for nothing
    skipped = _job(api, requirements=["torch==2.0.0; python_version < '3'"])
    assert skipped.status_code == 201, skipped.text


def test_without_advertising_workers_the_job_is_accepted(api: API) -> None:
    assert _job(api, requirements=["torch==2.0.0"]).status_code == 201


def test_a_search_checks_its_base_configs_requirements(api: API) -> None:
    config = {
        "search_space": {"learning_rate": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
        "max_trials": 2,
        "base_config": {"requirements": ["einops", "-r other.txt"]},
    }
    body = {"model_id": api.model_id, "dataset_id": api.dataset_id, "config": config}
    problem = _problem(api.owner.post("/v1/searches", json=body))
    assert problem["loc"] == ["body", "config", "base_config", "requirements", 1]
    assert "'-r other.txt'" in problem["msg"]


def test_the_job_shows_its_phase_and_environment(api: API) -> None:
    job_id = _job(api, requirements=["einops>=0.8"]).json()["id"]
    env_hash = secrets.token_hex(32)
    with api.sessions() as session:
        session.add(
            Environment(
                hash=env_hash, state="ready", requirements=["einops>=0.8"], python="3.11.9",
                platform="linux_x86_64", constraints_sha256="0" * 64,
                packages=[{"name": "einops", "version": "0.8.1"}], size_bytes=123456,
                build_seconds=1.5, ready_at=utcnow() + timedelta(seconds=2),
            )
        )  # fmt: skip
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                state="starting",
                phase="preparing_environment",
                environment_hash=env_hash,
                # (a lease that holds: the stack's reconciler re-queues a starting job without
                # one within its 2 s interval, before this test's reads were done on a slow run)
                lease_expires_at=utcnow() + timedelta(minutes=10),
            )
        )
        session.commit()
    shown = api.owner.get(f"/v1/jobs/{job_id}").json()
    assert shown["phase"] == "preparing_environment"
    assert shown["environment"] == {
        "hash": env_hash,
        "state": "ready",
        "packages": [{"name": "einops", "version": "0.8.1"}],
    }
    listed = api.owner.get("/v1/jobs", params={"limit": 200}).json()["data"]
    assert [item["environment"] for item in listed if item["id"] == job_id] == [
        shown["environment"]
    ]
    environment = api.owner.get(f"/v1/environments/{env_hash}")
    assert environment.status_code == 200, environment.text
    assert environment.json()["requirements"] == ["einops>=0.8"]
    assert environment.json()["packages"] == [{"name": "einops", "version": "0.8.1"}]
    assert (environment.json()["python"], environment.json()["size_bytes"]) == ("3.11.9", 123456)
    # another owner learns nothing: the same 404 as an unknown hash
    assert api.other.get(f"/v1/environments/{env_hash}").status_code == 404
    assert api.owner.get(f"/v1/environments/{secrets.token_hex(32)}").status_code == 404
    with ace3.Client(api_key=api.key, base_url=api.base_url) as client:
        handle = client.job(job_id)
        assert handle.phase == "preparing_environment"
        assert handle.requirements == ["einops>=0.8"]
        assert handle.environment is not None and handle.environment.hash == env_hash
        assert [(p.name, p.version) for p in handle.environment.packages] == [("einops", "0.8.1")]
        got = client.environments.get(env_hash)
        assert (got.state, got.build_seconds, got.error) == ("ready", 1.5, None)
