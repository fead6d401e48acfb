"""``ace3 checkpoints delete ID``: delete weights you uploaded to start jobs from
(``DELETE /v1/checkpoints/{id}``; ``client.checkpoints.upload`` gave the id). Refused, naming
them, while a job that has not finished starts or distils from them (exit code 2); exit code 3
when you uploaded none with that id."""

from __future__ import annotations

import argparse
from typing import Any

from ace3.cli import output
from ace3.cli.common import add_json_flag, make_client
from ace3.cli.errors import OK


def cmd_delete(args: argparse.Namespace) -> int:
    make_client().checkpoints.delete(args.id)
    if args.json:
        output.print_json({"id": args.id, "deleted": True})
    else:
        print(f"uploaded weights {args.id}: deleted")
    return OK


def add_parsers(sub: Any) -> None:
    checkpoints = sub.add_parser("checkpoints", help="weights you uploaded to start jobs from")
    verbs = checkpoints.add_subparsers(dest="checkpoints_command", required=True)
    delete = verbs.add_parser(
        "delete", help="delete uploaded weights (refused while an unfinished job uses them)"
    )
    delete.add_argument("id", help="the uploaded weights' id (client.checkpoints.upload's)")
    delete.set_defaults(func=cmd_delete)
    add_json_flag(delete)
