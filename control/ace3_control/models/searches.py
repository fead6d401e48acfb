"""Hyperparameter searches and their trials."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from ace3_control.models.base import Base, new_id, utcnow
from ace3_control.models.states import SearchState, TrialState


class Search(Base):
    """A hyperparameter search; its driver lease says which API process advances it."""

    __tablename__ = "searches"
    __table_args__ = (
        UniqueConstraint("owner_id", "idempotency_key", name="uq_searches_owner_idempotency_key"),
        Index("ix_searches_owner_created", "owner_id", "created_at", "id"),
        Index("ix_searches_state", "state"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"))
    name: Mapped[str | None] = mapped_column(String(200))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id"))
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"))
    validation_dataset_id: Mapped[str | None] = mapped_column(ForeignKey("datasets.id"))
    config: Mapped[dict[str, Any]]
    model_kwargs: Mapped[dict[str, Any]]
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16), default=SearchState.QUEUED)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(Text)
    driver_id: Mapped[str | None] = mapped_column(String(200))
    driver_lease_expires_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class SearchTrial(Base):
    """One trial: the parameters Optuna chose, the job that trains them, and what it reported."""

    __tablename__ = "search_trials"
    __table_args__ = (
        UniqueConstraint("search_id", "number", name="uq_search_trials_search_number"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    search_id: Mapped[str] = mapped_column(
        ForeignKey("searches.id", ondelete="CASCADE"), index=True
    )
    number: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]]
    sampler_params: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16), default=TrialState.RUNNING)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id"))
    value: Mapped[float | None] = mapped_column(Float)
    intermediate_values: Mapped[dict[str, Any]]
    system_attrs: Mapped[dict[str, Any]]
    judged_epochs: Mapped[int] = mapped_column(Integer, default=0)
    epochs_run: Mapped[int] = mapped_column(Integer, default=0)
    prune_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    checkpoint_id: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
