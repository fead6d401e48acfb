"""What the user verbs share: the SDK client (``ACE3_API_KEY`` / ``ACE3_BASE_URL``, as the SDK
reads them) and the ``--json`` flag."""

from __future__ import annotations

import argparse
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
