"""``ace3 environments show HASH``: what a per-job Python environment holds
(``/v1/environments/{hash}``; a job's environment hash is in ``ace3 jobs show``)."""

from __future__ import annotations

import argparse
from typing import Any

from ace3.cli import output
from ace3.cli.common import add_json_flag, make_client
from ace3.cli.errors import OK


def cmd_show(args: argparse.Namespace) -> int:
    environment = make_client().environments.get(args.hash)
    if args.json:
        output.print_json(environment)
        return OK
    output.print_fields(
        f"environment {environment.hash}",
        [
            ("state", environment.state),
            ("requirements", ", ".join(environment.requirements) or None),
            ("python", environment.python),
            ("platform", environment.platform),
            ("size", None if environment.size_bytes is None else f"{environment.size_bytes} bytes"),
            ("build seconds", environment.build_seconds),
            ("created", environment.created_at),
            ("ready", environment.ready_at),
            ("error", environment.error),
        ],
    )
    output.print_table(
        "packages it adds to the worker's Python",
        ["NAME", "VERSION"],
        [(package.name, package.version) for package in environment.packages],
    )
    return OK


def add_parsers(sub: Any) -> None:
    environments = sub.add_parser(
        "environments", help="the per-job Python environments your jobs used"
    )
    verbs = environments.add_subparsers(dest="environments_command", required=True)
    show = verbs.add_parser(
        "show", help="one environment: its requirements, packages, size and build"
    )
    show.add_argument("hash", help="the environment's hash (ace3 jobs show ID names it)")
    show.set_defaults(func=cmd_show)
    add_json_flag(show)
