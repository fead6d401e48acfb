"""docker-compose.yml cannot run here (no Docker engine), so its shape and commands are checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ace3.cli import build_parser

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_services_and_their_dependencies(compose: dict) -> None:
    services = compose["services"]
    assert {"postgres", "redis", "objectstore", "migrate", "api", "worker"} <= set(services)
    for name in ("postgres", "redis", "objectstore"):
        assert "healthcheck" in services[name], name
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("api", "worker"):
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
        assert depends["objectstore"]["condition"] == "service_healthy"
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]


def test_the_api_and_workers_share_an_object_store_not_a_volume(compose: dict) -> None:
    services = compose["services"]
    api_volumes = {str(volume).split(":")[0] for volume in services["api"].get("volumes", [])}
    worker_volumes = {str(v).split(":")[0] for v in services["worker"].get("volumes", [])}
    assert not api_volumes & worker_volumes, "workers do not mount the API's volume"
    settings = {
        name: {
            key: services[name]["environment"].get(key)
            for key in ("ACE3_STORAGE_URL", "ACE3_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID")
        }
        for name in ("migrate", "api", "worker")
    }
    assert settings["api"] == settings["worker"] == settings["migrate"]
    assert settings["api"]["ACE3_STORAGE_URL"].startswith("s3://")
    assert settings["api"]["ACE3_S3_ENDPOINT_URL"] == "http://objectstore:9000"
    secret = services["api"]["environment"]["AWS_SECRET_ACCESS_KEY"]
    assert secret.startswith("${ACE3_S3_SECRET_KEY:?"), "no default secret"
    store = services["objectstore"]
    assert store["environment"]["MINIO_ROOT_PASSWORD"] == secret
    assert "ports" not in store, "reachable by the services, not published"
    assert any(str(volume).startswith("objects:") for volume in store["volumes"])


def test_every_ace3_command_is_a_real_cli_command(compose: dict) -> None:
    seen = set()
    for name, service in compose["services"].items():
        command = service.get("command")
        if not command or command[0] != "ace3":
            continue
        args = build_parser().parse_args(
            command[1:]
        )  # exits (fails the test) on an unknown command
        assert callable(args.func), name
        seen.add(args.command)
    assert seen == {"migrate", "server", "worker"}


def test_services_share_one_database_and_broker(compose: dict) -> None:
    services = compose["services"]
    urls = {
        (
            services[name]["environment"]["ACE3_DATABASE_URL"],
            services[name]["environment"]["ACE3_BROKER_URL"],
        )
        for name in ("migrate", "api", "worker")
    }
    assert len(urls) == 1
    database_url, broker_url = urls.pop()
    assert database_url.startswith("postgresql://") and "@postgres:" in database_url
    assert broker_url.startswith("redis://:") and "@redis:6379/" in broker_url


def test_the_database_and_broker_need_passwords_with_no_default(compose: dict) -> None:
    """Multi-node jobs share the worker's network: no trust auth, no open Redis, and no
    password a job could guess from this public file."""
    services = compose["services"]
    required = "${ACE3_POSTGRES_PASSWORD:?"
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith(required)
    assert f":{required}" in services["api"]["environment"]["ACE3_DATABASE_URL"]
    redis_password = "${ACE3_REDIS_PASSWORD:?"
    command = services["redis"]["command"]
    assert command[command.index("--requirepass") + 1].startswith(redis_password)
    assert services["api"]["environment"]["ACE3_BROKER_URL"].startswith(
        f"redis://:{redis_password}"
    )


def test_the_worker_gets_what_the_job_sandbox_needs_and_insists_on_it(compose: dict) -> None:
    worker = compose["services"]["worker"]
    assert worker["environment"]["ACE3_SANDBOX"] == "bwrap", "no silent fallback"
    assert {"SYS_ADMIN", "NET_ADMIN"} <= set(worker["cap_add"])
    assert "apparmor=unconfined" in worker["security_opt"]
    assert "privileged" not in worker, "only what bubblewrap needs"
    for name in ("api", "migrate"):
        assert "cap_add" not in compose["services"][name]
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text()
    assert "bubblewrap" in dockerfile and "util-linux" in dockerfile


def test_datasets_from_buckets_are_configured_where_they_are_read(
    compose: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API holds the allow-list (empty unless .env sets it), the worker bounds its shard
    cache; the image installs the worker extra, which brings the streaming one."""
    import tomllib

    from ace3_control.settings import Settings

    services = compose["services"]
    sources = services["api"]["environment"]["ACE3_DATASET_SOURCES"]
    assert sources == "${ACE3_DATASET_SOURCES:-}", "none allowed unless the operator says so"
    assert "ACE3_DATASET_SOURCES" not in services["worker"]["environment"]
    bound = services["worker"]["environment"]["ACE3_DATASET_CACHE_BYTES"]
    default = bound.removeprefix("${ACE3_DATASET_CACHE_BYTES:-").removesuffix("}")
    monkeypatch.setenv("ACE3_DATASET_SOURCES", "")  # what compose passes when unset
    monkeypatch.setenv("ACE3_DATASET_CACHE_BYTES", default)
    settings = Settings()
    assert settings.dataset_sources is None
    assert settings.dataset_cache_bytes == Settings.model_fields["dataset_cache_bytes"].default
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text()
    assert "pip install -e '.[worker]'" in dockerfile
    extras = tomllib.loads((COMPOSE.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert "streaming" in extras["worker"][0] and "server" in extras["worker"][0]
    assert {"pyarrow", "zstandard", "torchdata"} <= {
        requirement.split(">")[0] for requirement in extras["streaming"]
    }


def test_job_environments_are_configured_on_the_worker_alone(
    compose: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wheel sources (which may carry credentials) reach the worker and not the API; what
    compose passes when .env leaves them unset is read as unset; the image has uv."""
    import tomllib

    from ace3_control.settings import Settings

    services = compose["services"]
    worker = services["worker"]["environment"]
    names = ("ACE3_PIP_INDEX_URL", "ACE3_PIP_EXTRA_INDEX_URL", "ACE3_PIP_FIND_LINKS")
    for name in names:
        assert worker[name] == f"${{{name}:-}}", name
        assert name not in services["api"]["environment"], name
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("ACE3_PIP_OFFLINE", "false")
    settings = Settings()
    assert (settings.pip_index_url, settings.pip_extra_index_url, settings.pip_find_links) == (
        None,
        None,
        None,
    )
    assert settings.pip_offline is False
    extras = tomllib.loads((COMPOSE.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(requirement.startswith("uv>=") for requirement in extras["worker"])
