"""The ``ace3`` command.

Service verbs (:mod:`ace3.cli.service`): ``server``, ``worker``, ``up``, ``migrate``, ``keys``;
they import the server and worker packages only inside the subcommand, so the plain SDK install
keeps working without them. User verbs: ``train`` and ``search`` (:mod:`ace3.cli.submit`, YAML
files read by :mod:`ace3.cli.jobfile`), ``jobs`` (:mod:`ace3.cli.jobs`), ``searches``
(:mod:`ace3.cli.searches`), ``datasets`` (:mod:`ace3.cli.datasets`), ``checkpoints``
(:mod:`ace3.cli.checkpoints`), ``workers`` (:mod:`ace3.cli.workers`) and ``environments``
(:mod:`ace3.cli.environments`); they are clients of the SDK's :class:`ace3.Client` (``ACE3_API_KEY``
/ ``ACE3_BASE_URL``), never of the database. Exit codes: :mod:`ace3.cli.errors`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ace3.cli.errors import EXIT_CODES_HELP, exit_code_for
from ace3.cli.output import printable
from ace3.cli.service import worker_argv

__all__ = ["build_parser", "main", "worker_argv"]


def build_parser() -> argparse.ArgumentParser:
    from ace3.cli import (
        checkpoints,
        datasets,
        environments,
        jobs,
        searches,
        service,
        submit,
        workers,
    )

    parser = argparse.ArgumentParser(
        prog="ace3",
        description="ACE3: training as a service for PyTorch. The user verbs read "
        "ACE3_API_KEY and ACE3_BASE_URL, like the SDK.",
        epilog=EXIT_CODES_HELP,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    submit.add_parsers(sub)
    jobs.add_parsers(sub)
    searches.add_parsers(sub)
    datasets.add_parsers(sub)
    checkpoints.add_parsers(sub)
    workers.add_parsers(sub)
    environments.add_parsers(sub)
    service.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            raise
        code, message = exit_code_for(exc)  # re-raises what it does not know: a bug's traceback
        print(f"ace3: {printable(message)}", file=sys.stderr)  # (the service's words, too)
        return code
