"""Who still needs stored weights by id: the jobs that have not finished and start from them
(``config.init_from_checkpoint_id``) or distil from them
(``config.distillation.teacher_checkpoint_id``), and the searches that have not finished whose
``base_config`` names them (their trials' jobs are made later, from that config). Jobs and
searches name weights in their config, with no foreign key, so whatever deletes weights asks
here first: the API before it deletes uploaded weights (``DELETE /v1/checkpoints/{id}``), the
worker before its keep-last-N pruning forgets a job's old checkpoints. One query for both (it
runs on synchronous and asynchronous sessions)."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from sqlalchemy import CompoundSelect, select, union_all

from ace3_control.models import ACTIVE_SEARCH_STATES, ACTIVE_STATES, Job, JobState, Search

UNFINISHED_JOB_STATES = (JobState.QUEUED, *ACTIVE_STATES)
"""The states of a job that may still read its inputs."""

NAMED_USERS = 5
"""How many users a refusal names (the rest are counted)."""


def weights_users(weights_ids: Collection[str]) -> CompoundSelect[str, str]:
    """``(weights_id, user)`` for every unfinished job or search naming one of
    ``weights_ids``; ``user`` says which (``job <id>``, ``search <id>``), ordered by it."""
    ids = list(weights_ids)
    base = Search.config["base_config"]
    users = [
        (reference, "job " + Job.id, Job.state.in_(UNFINISHED_JOB_STATES))
        for reference in (
            Job.config["init_from_checkpoint_id"].as_string(),
            Job.config["distillation"]["teacher_checkpoint_id"].as_string(),
        )
    ] + [
        (reference, "search " + Search.id, Search.state.in_(ACTIVE_SEARCH_STATES))
        for reference in (
            base["init_from_checkpoint_id"].as_string(),
            base["distillation"]["teacher_checkpoint_id"].as_string(),
        )
    ]
    return union_all(
        *(
            select(reference.label("weights_id"), user.label("user")).where(
                reference.in_(ids), unfinished
            )
            for reference, user, unfinished in users
        )
    ).order_by("user")


def in_use_message(users: Iterable[str]) -> str:
    """What a refused delete says: who still needs the thing (each once, the first
    ``NAMED_USERS`` by name), and what to do."""
    distinct = list(dict.fromkeys(users))
    named = ", ".join(distinct[:NAMED_USERS])
    if len(distinct) == 1:
        return f"in use by {named}, which has not finished; cancel it first"
    more = f" and {len(distinct) - NAMED_USERS} more" if len(distinct) > NAMED_USERS else ""
    return f"in use by {named}{more}, which have not finished; cancel them first"
