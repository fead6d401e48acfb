"""The search loop, owned by the service: one pass advances every active search a little.

A pass, for a search this process holds the driver lease of:
1. reads each running trial's job: its objective per epoch (the intermediate values), its epochs,
   and, once the job ended, the trial's outcome;
2. asks the pruner about running trials that reported a new epoch; a pruned trial's job is
   cancelled (the worker stops it within a heartbeat) and the trial ends ``pruned``;
3. stops the search when its trials are spent, its failure budget is spent, or it was cancelled;
4. otherwise asks Optuna for new parameters until ``parallel_trials`` run, creating each trial
   and its job in one transaction (the trial number is unique, so nothing runs twice) and
   publishing the job after the commit.

Every pass rebuilds the Optuna study from the rows (see ``study.py``). The lease (a conditional
update) lets several API processes run this loop: each search is advanced by one at a time, and
by another when that one dies.

This module holds the lease and the loop; one search's step is :mod:`.advance` (reading trials:
:mod:`.trial_outcomes`, starting them: :mod:`.trial_start`), what wakes the loop :mod:`.wakes`.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3_control.db import rows_changed
from ace3_control.models import ACTIVE_SEARCH_STATES, Search, SearchTrial, TrialState, utcnow
from ace3_control.settings import Settings
from ace3_server.searches.advance import advance
from ace3_server.searches.wakes import DriverWakes
from ace3_server.services.jobs import publish_safely
from ace3_server.services.publishing import Publisher

__all__ = ["DriverWakes", "drive_once", "driver_identity", "run_search_driver"]

logger = logging.getLogger(__name__)


def driver_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def _claim(
    session: AsyncSession, search_id: str, driver_id: str, lease_seconds: float
) -> bool:
    now = utcnow()
    result = await session.execute(
        update(Search)
        .where(
            Search.id == search_id,
            Search.state.in_(ACTIVE_SEARCH_STATES),
            or_(
                Search.driver_id == driver_id,
                Search.driver_lease_expires_at.is_(None),
                Search.driver_lease_expires_at < now,
            ),
        )
        .values(driver_id=driver_id, driver_lease_expires_at=now + timedelta(seconds=lease_seconds))
    )
    return bool(rows_changed(result))


async def drive_once(
    session_factory: async_sessionmaker[AsyncSession],
    publisher: Publisher,
    settings: Settings,
    driver_id: str,
) -> set[str]:
    """One pass over the searches this process may drive; the jobs of their running trials."""
    running: set[str] = set()
    async with session_factory() as session:
        now = utcnow()
        candidates = (
            await session.scalars(
                select(Search.id).where(
                    Search.state.in_(ACTIVE_SEARCH_STATES),
                    or_(
                        Search.driver_id == driver_id,
                        Search.driver_lease_expires_at.is_(None),
                        Search.driver_lease_expires_at < now,
                    ),
                )
            )
        ).all()
    for search_id in candidates:
        async with session_factory() as session:
            if not await _claim(session, search_id, driver_id, settings.search_lease_seconds):
                await session.rollback()
                continue
            await session.commit()
            search = await session.get(Search, search_id)
            if search is None:
                continue
            try:
                job_ids = await advance(session, search, settings)
            except Exception:
                await session.rollback()
                logger.exception("search %s: driver pass failed; retrying next pass", search_id)
                continue
            await session.commit()
            running |= set(
                await session.scalars(
                    select(SearchTrial.job_id).where(
                        SearchTrial.search_id == search_id,
                        SearchTrial.state == TrialState.RUNNING,
                        SearchTrial.job_id.is_not(None),
                    )
                )
            )
        for job_id in job_ids:
            await publish_safely(publisher, job_id)
    return running


async def run_search_driver(
    session_factory: async_sessionmaker[AsyncSession],
    publisher: Publisher,
    settings: Settings,
    wakes: DriverWakes,
) -> None:
    """Advance the active searches every ``search_tick_seconds``, and at once when ``wakes``
    says (:class:`DriverWakes`)."""
    driver_id = driver_identity()
    while True:
        try:
            wakes.jobs = await drive_once(session_factory, publisher, settings, driver_id)
        except Exception:
            logger.exception("search driver pass failed; trying again")
        await wakes.wait(settings.search_tick_seconds)
