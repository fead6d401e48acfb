"""Response bodies of per-job Python environments (docs/environments.md): the environment a job's
requirements resolved to (``JobOut.environment``) and ``GET /v1/environments/{hash}``."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator


class PackageOut(BaseModel):
    """A distribution an environment holds."""

    name: str
    version: str


class JobEnvironmentOut(BaseModel):
    """The environment a worker resolved a job's requirements to (GET /v1/environments/{hash}
    for all of it)."""

    hash: str
    state: str | None = Field(
        description="building, ready or failed; null when the environment's record is gone."
    )
    packages: list[PackageOut] = Field(
        description="What it adds to the worker's Python (empty until it is built)."
    )


class EnvironmentOut(BaseModel):
    """A per-job Python environment (docs/environments.md): the wheels a set of requirements
    resolved to on top of a worker's installation, built once per cluster."""

    model_config = ConfigDict(from_attributes=True)

    hash: str
    state: str = Field(description="building, ready or failed.")
    requirements: list[str] = Field(description="The normalised requirements it was built for.")
    packages: list[PackageOut] = Field(
        description="What it adds to the worker's Python (empty until it is built)."
    )
    python: str = Field(description="The Python version it was built for.")
    platform: str
    size_bytes: int | None = Field(None, description="Unpacked; null until built.")
    build_seconds: float | None = None
    error: str | None = Field(None, description="Why its build failed (names the package).")
    created_at: datetime
    ready_at: datetime | None = None

    @field_validator("packages", mode="before")
    @classmethod
    def _none_is_empty(cls, value: object) -> object:
        return [] if value is None else value
