"""``ace3 workers``: the live workers and what one job may use on each (``/v1/workers``)."""

from __future__ import annotations

import argparse
from typing import Any

from ace3.cli import output
from ace3.cli.common import add_json_flag, make_client
from ace3.cli.errors import OK


def cmd_workers(args: argparse.Namespace) -> int:
    client = make_client()
    workers = client.workers.list()
    if args.json:
        output.print_json(workers)
        return OK
    output.print_table(
        None,
        ["ID", "HOST", "DEVICE", "PROCESSES PER JOB", "SLOTS", "QUEUE", "LAST SEEN"],
        [
            (w.id, w.hostname, w.device_kind, w.device_count, w.slots, w.queue, w.last_seen_at)
            for w in workers
        ],
    )
    return OK


def add_parsers(sub: Any) -> None:
    workers = sub.add_parser("workers", help="the live workers and their capacity")
    workers.set_defaults(func=cmd_workers)
    add_json_flag(workers)
