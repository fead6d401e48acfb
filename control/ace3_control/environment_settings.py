"""The settings of per-job Python environments (docs/environments.md), read from ACE3_*
variables like the rest of :class:`ace3_control.settings.Settings`: where a worker gets wheels
(``ACE3_PIP_*``; never visible to a job), and the limits of building and caching.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class EnvironmentSettings(BaseSettings):
    """Where a worker's environment builds get their wheels, and how large and long they may be."""

    model_config = SettingsConfigDict(env_prefix="ACE3_", extra="ignore")

    pip_index_url: str | None = Field(
        None,
        description="The package index environments are built from (uv's --index-url); "
        "default: uv's own (PyPI). May carry credentials: jobs never see it.",
    )
    pip_extra_index_url: str | None = Field(
        None,
        description="Further package indexes, space-separated (uv's --extra-index-url).",
    )
    pip_find_links: str | None = Field(
        None,
        description="A wheelhouse: a directory of wheels or a URL of a page linking them "
        "(uv's --find-links), searched beside the index.",
    )
    pip_offline: bool = Field(
        False,
        description="true: build from the wheelhouse (ACE3_PIP_FIND_LINKS) alone, no index and "
        "no network (uv's --no-index --offline).",
    )
    pip_allow_source_builds: bool = Field(
        False,
        description="false (the default): wheels only, so no package's setup.py or build "
        "backend ever runs on a worker. true: a package published only as an sdist is built, "
        "by uv, as the build's unprivileged uid in the build's sandbox, with the host's network "
        "when an index is used and the index settings in its environment "
        "(docs/environments.md says what that means); ignored under ACE3_SANDBOX=uid.",
    )
    env_cache_dir: Path | None = Field(
        None,
        description="A worker's cache of built environments (hidden from jobs); default "
        "data_dir/environments. On the work directory's filesystem, an environment is "
        "hard-linked into each job that uses it instead of copied.",
    )
    env_cache_bytes: int = Field(
        10 * 1024**3,
        ge=1,
        description="The most bytes of unpacked environments a worker keeps; the least "
        "recently used ones no running job uses are removed first.",
    )
    env_build_timeout_seconds: float = Field(
        900.0,
        gt=0,
        description="The longest an environment's resolve and install may take; past it the "
        "job fails saying so (not retried).",
    )
    env_max_bytes: int = Field(
        5 * 1024**3,
        ge=1,
        description="The largest environment a build may produce (unpacked); past it the job "
        "fails saying so (not retried).",
    )
    env_build_uid: int = Field(
        65534,
        ge=1,
        description="The unprivileged uid (and gid) a root worker resolves and unpacks wheels "
        "as (wheels are untrusted archives); not one of the job uids. A worker that is not "
        "root builds as itself.",
    )

    @field_validator("pip_index_url", "pip_extra_index_url", "pip_find_links")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None
