"""Per-job Python environments, one row per environment the cluster built or is building
(docs/environments.md). The row is also the build's lock: the worker that inserted it (or took
over its expired lease) builds; the others wait for ``state`` to leave ``building``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from ace3_control.models.base import Base, utcnow


class EnvironmentState:
    BUILDING = "building"
    READY = "ready"
    FAILED = "failed"


class Environment(Base):
    """An environment: the wheels a set of requirements resolved to on top of one worker
    installation, stored in the artifact store as an archive.

    ``hash`` is the sha256 of (the normalised requirements, the Python version, the platform,
    the worker's installed set); ``packages`` is what the resolver added (``[{"name",
    "version"}]``); ``constraints`` the worker's installed set it was resolved against.
    """

    __tablename__ = "environments"

    hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), default=EnvironmentState.BUILDING)
    requirements: Mapped[list[str]] = mapped_column(JSON)
    python: Mapped[str] = mapped_column(String(32))
    platform: Mapped[str] = mapped_column(String(64))
    constraints_sha256: Mapped[str] = mapped_column(String(64))
    packages: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=None)
    # The build's lease: who builds, and until when (renewed while it builds).
    builder: Mapped[str | None] = mapped_column(String(200), default=None)
    lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    storage_key: Mapped[str | None] = mapped_column(String(500), default=None)
    sha256: Mapped[str | None] = mapped_column(String(64), default=None)  # of the archive
    archive_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger, default=None)  # unpacked
    build_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(default=None)
    last_used_at: Mapped[datetime] = mapped_column(default=utcnow)
