"""What the user verbs share: the SDK client (``ACE3_API_KEY`` / ``ACE3_BASE_URL``, as the SDK
reads them), the ``--json`` flag, and the ``list`` and ``cancel`` verbs of the runs (jobs and
searches: the same logic over ``client.jobs`` or ``client.searches``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any


def make_client() -> Any:
    """An :class:`ace3.Client` from the environment; no API key is exit code 4."""
    from ace3.cli.errors import UNREACHABLE, CLIError
    from ace3.client import Client
    from ace3.errors import ACE3Error

    try:
        return Client()
    except ACE3Error as exc:
        raise CLIError(str(exc), UNREACHABLE) from None


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print JSON for scripts (stdout holds only JSON)"
    )


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (else a usage error, exit code 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_list_parser(verbs: Any, what: str, state_example: str = "") -> argparse.ArgumentParser:
    """``<what>s list [--state S] [--limit N] [--json]``."""
    listing: argparse.ArgumentParser = verbs.add_parser("list", help=f"your {what}s, newest first")
    listing.add_argument("--state", default=None, help=f"only {what}s in this state{state_example}")
    listing.add_argument(
        "--limit", type=positive_int, default=20, help="at most this many (default 20)"
    )
    return listing


def list_runs(
    collection: Any,
    args: argparse.Namespace,
    columns: Sequence[str],
    row: Callable[[Any], Sequence[Any]],
) -> int:
    """The newest ``args.limit`` runs (in ``args.state``) of ``collection`` as JSON or a
    table of ``columns`` (``row`` of each)."""
    from ace3.cli import output
    from ace3.cli.errors import OK

    runs: list[Any] = []
    for run in collection.list(state=args.state, limit=min(args.limit, 100)):
        runs.append(run)
        if len(runs) >= args.limit:
            break
    if args.json:
        output.print_json(runs)
        return OK
    output.print_table(None, list(columns), [tuple(row(run)) for run in runs])
    return OK


def cancel_run(collection: Any, args: argparse.Namespace, kind: str) -> int:
    """Ask run ``args.id`` to stop; print it as JSON or ``<kind> <id>: <state>``."""
    from ace3.cli import output
    from ace3.cli.errors import OK

    run = collection.cancel(args.id)
    if args.json:
        output.print_json(run)
    else:
        print(f"{kind} {run.id}: {run.state}")
    return OK
