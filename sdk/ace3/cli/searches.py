"""``ace3 searches list|show|cancel``: the search verbs, clients of ``/v1/searches``."""

from __future__ import annotations

import argparse
from typing import Any

from ace3.cli import output
from ace3.cli.common import add_json_flag, add_list_parser, cancel_run, list_runs, make_client
from ace3.cli.errors import OK


def cmd_list(args: argparse.Namespace) -> int:
    return list_runs(
        make_client().searches,
        args,
        ["ID", "NAME", "STATE", "TRIALS", "OBJECTIVE", "BEST", "CREATED"],
        lambda s: (
            s.id,
            s.name,
            s.state,
            f"{s.trials_created}/{s.trial_budget or '-'}",
            f"{s.objective} ({s.direction})",
            s.best_trial.value if s.best_trial is not None else None,
            s.created_at,
        ),
    )


def cmd_show(args: argparse.Namespace) -> int:
    client = make_client()
    search = client.searches.retrieve(args.id)
    trials = client.searches.trials(args.id)
    if args.json:
        output.print_json({**search.model_dump(mode="json"), "trials": trials})
        return OK
    best = search.best_trial
    output.print_fields(
        f"search {search.id}",
        [
            ("name", search.name),
            ("state", search.state),
            ("objective", f"{search.objective} ({search.direction})"),
            ("algorithm", search.config.get("algorithm")),
            (
                "trials",
                f"{search.trials_created} created, {search.trials_running} running, "
                f"{search.trials_succeeded} succeeded, {search.trials_pruned} pruned, "
                f"{search.trials_failed} failed (budget {search.trial_budget or '-'})",
            ),
            ("best value", best.value if best else None),
            ("best parameters", best.params if best else None),
            ("best job", best.job_id if best else None),
            ("created", search.created_at),
            ("finished", search.finished_at),
            ("error", search.error),
        ],
    )
    output.print_table(
        "trials",
        ["#", "STATE", "PARAMS", search.objective.upper(), "EPOCHS", "JOB"],
        [(t.number, t.state, t.params, t.value, t.epochs_run, t.job_id) for t in trials],
    )
    return OK


def cmd_cancel(args: argparse.Namespace) -> int:
    return cancel_run(make_client().searches, args, "search")


def add_parsers(sub: Any) -> None:
    searches = sub.add_parser("searches", help="list, inspect and cancel hyperparameter searches")
    verbs = searches.add_subparsers(dest="searches_command", required=True)
    listing = add_list_parser(verbs, "search")
    listing.set_defaults(func=cmd_list)
    show = verbs.add_parser("show", help="one search and its trials")
    show.set_defaults(func=cmd_show)
    cancel = verbs.add_parser("cancel", help="ask a search (and its running trials) to stop")
    cancel.set_defaults(func=cmd_cancel)
    for parser in (show, cancel):
        parser.add_argument("id", help="the search id")
    for parser in (listing, show, cancel):
        add_json_flag(parser)
