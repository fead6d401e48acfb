"""Owners and their API keys."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    ForeignKey,
    Integer,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from ace3_control.models.base import Base, new_id, utcnow


class Owner(Base):
    __tablename__ = "owners"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Quotas (``ace3 owners set-quota``; None: no limit): jobs holding a worker at once, and
    # processes (GPUs, or processes on CPU workers) those jobs run together. A job over quota
    # waits in the queue.
    max_running_jobs: Mapped[int | None] = mapped_column(Integer, default=None)
    max_gpus: Mapped[int | None] = mapped_column(Integer, default=None)
    # The highest priority the owner's jobs may ask for (``high`` or ``normal``); None:
    # the service's default (``ACE3_DEFAULT_MAX_PRIORITY``, ``normal``): ``high`` is an admin's
    # grant, so no owner jumps every other owner's queue by asking.
    max_priority: Mapped[str | None] = mapped_column(String(8), default=None)
    # When a worker last claimed one of the owner's jobs: owners served longest ago go first
    # among equals (fair share).
    last_claimed_at: Mapped[datetime | None] = mapped_column(default=None)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    lookup_prefix: Mapped[str] = mapped_column(String(16), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
