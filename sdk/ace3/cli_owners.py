"""``ace3 owners``: owners' quotas of the fair queue (an admin's command: it talks to the
database, like ``ace3 keys``). ``set-quota OWNER [--max-running-jobs N] [--max-gpus N]
[--max-priority high|normal]`` sets or, with ``none``, lifts a limit; ``list`` prints every owner with its limits and what it
holds now. Server packages are imported inside the commands (the SDK stays light)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _limit(text: str) -> int | None:
    """``N >= 0``, or ``none`` (no limit)."""
    if text.strip().lower() in ("none", "unlimited"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number >= 0 or 'none', not {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 or 'none', not {value}")
    return value


def _priority(text: str) -> str | None:
    """``high`` or ``normal`` (the highest priority the owner may ask for), or ``none`` (the
    service's default, ``ACE3_DEFAULT_MAX_PRIORITY``)."""
    value = text.strip().lower()
    if value in ("none", "default"):
        return None
    if value not in ("high", "normal"):
        raise argparse.ArgumentTypeError(f"expected high, normal or none, not {text!r}")
    return value


def _session() -> Any:
    from ace3_control.db import make_sync_engine, sync_session_factory
    from ace3_control.settings import get_settings

    return sync_session_factory(make_sync_engine(get_settings().resolved_database_url))()


def _shown(value: int | str | None) -> str:
    return "-" if value is None else str(value)


def cmd_set_quota(args: argparse.Namespace) -> int:
    from ace3_control.models import Owner

    changes = {
        name: getattr(args, name)
        for name in ("max_running_jobs", "max_gpus", "max_priority")
        if getattr(args, name) is not _UNSET
    }
    if not changes:
        print(
            "ace3: give --max-running-jobs, --max-gpus (a number, or none) and/or "
            "--max-priority (high, normal, or none)",
            file=sys.stderr,
        )
        return 2
    with _session() as session:
        owner = session.get(Owner, args.owner)
        if owner is None:
            print(
                f"ace3: no owner with id {args.owner!r} (see `ace3 owners list`)", file=sys.stderr
            )
            return 2
        for name, value in changes.items():
            setattr(owner, name, value)
        session.commit()
        print(
            f"owner {owner.id}: max_running_jobs={_shown(owner.max_running_jobs)} "
            f"max_gpus={_shown(owner.max_gpus)} max_priority={_shown(owner.max_priority)}"
        )
        _warn_of_stranded_jobs(session, owner)
    return 0


def _warn_of_stranded_jobs(session: Any, owner: Any) -> None:
    """Queued jobs the new limits keep from ever running (larger than ``max_gpus``, or any job
    under ``max_running_jobs=0``) stay queued, with waiting_reason ``quota``: say which, and how
    to end them, rather than let them wait unseen."""
    from sqlalchemy import select

    from ace3_control.models import Job, JobState

    queued = select(Job.id, Job.num_processes).where(
        Job.owner_id == owner.id, Job.state == JobState.QUEUED
    )
    if owner.max_running_jobs != 0:
        if owner.max_gpus is None:
            return
        queued = queued.where(Job.num_processes > owner.max_gpus)
    stranded = session.execute(queued.order_by(Job.created_at)).all()
    if not stranded:
        return
    why = (
        "max_running_jobs=0"
        if owner.max_running_jobs == 0
        else f"they need more than max_gpus={owner.max_gpus}"
    )
    print(
        f"warning: {len(stranded)} queued job(s) of this owner cannot run under these limits "
        f"({why}); they stay queued until the limits change or they are cancelled "
        "(ace3 jobs cancel ID, with the owner's key): "
        + ", ".join(row.id for row in stranded[:20])
        + (" ..." if len(stranded) > 20 else ""),
        file=sys.stderr,
    )


def cmd_list(_: argparse.Namespace) -> int:
    from sqlalchemy import func, select

    from ace3_control.models import ACTIVE_STATES, Job, JobState, Owner

    running = func.count().filter(Job.state.in_(ACTIVE_STATES))
    processes = func.coalesce(func.sum(Job.num_processes).filter(Job.state.in_(ACTIVE_STATES)), 0)
    queued = func.count().filter(Job.state == JobState.QUEUED)
    with _session() as session:
        rows = session.execute(
            select(Owner, running, processes, queued)
            .outerjoin(Job, Job.owner_id == Owner.id)
            .group_by(Owner.id)
            .order_by(Owner.created_at, Owner.id)
        ).all()
    print(
        "owner                             name              max_running_jobs  max_gpus  "
        "max_priority  running  gpus  queued"
    )
    for owner, running_jobs, gpus, waiting in rows:
        print(
            f"{owner.id:32}  {owner.name[:16]:16}  {_shown(owner.max_running_jobs):>16}  "
            f"{_shown(owner.max_gpus):>8}  {_shown(owner.max_priority):>12}  "
            f"{running_jobs:>7}  {gpus:>4}  {waiting:>6}"
        )
    return 0


_UNSET: Any = object()


def add_owners_parser(sub: Any) -> None:
    """``ace3 owners ...`` under the CLI's subcommands."""
    owners = sub.add_parser("owners", help="owners' quotas (the fair queue)").add_subparsers(
        dest="owners_command", required=True
    )
    quota = owners.add_parser(
        "set-quota", help="limit an owner's running jobs and GPUs (processes on CPU workers)"
    )
    quota.add_argument("owner", help="the owner's id (ace3 owners list)")
    for flag, what in (
        ("--max-running-jobs", "jobs holding a worker at once"),
        ("--max-gpus", "GPUs (processes on CPU workers) of those jobs together"),
    ):
        quota.add_argument(flag, type=_limit, default=_UNSET, metavar="N|none", help=what)
    quota.add_argument(
        "--max-priority",
        type=_priority,
        default=_UNSET,
        metavar="high|normal|none",
        help="the highest priority the owner's jobs may ask for (none: the service's default, "
        "ACE3_DEFAULT_MAX_PRIORITY, normal)",
    )
    quota.set_defaults(func=cmd_set_quota)
    owners.add_parser("list", help="owners with their quotas and usage").set_defaults(func=cmd_list)
