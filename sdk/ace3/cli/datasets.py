"""``ace3 datasets register|upload|list|show``: datasets, clients of ``/v1/datasets``.
``register`` records the shards under an s3:// prefix the service may read as a dataset (nothing
is uploaded); ``upload`` uploads a local directory of shards, each unless the service has it
already (``client.load_dataset(directory, format=...)``: an interrupted upload resumes). Either
id is a ``dataset_id`` for jobs and searches (``POST /v1/jobs``, the SDK's
``client.jobs.create``; ``client.datasets.retrieve(id)`` for a trainer)."""

from __future__ import annotations

import argparse
from typing import Any

from ace3.cli import output
from ace3.cli.common import add_json_flag, positive_int
from ace3.cli.errors import OK
from ace3.config.text_records import RECORD_KINDS

FORMATS = ("webdataset", "parquet", "jsonl", "tokens")


def _fields(dataset: Any) -> list[tuple[str, Any]]:
    return [
        ("name", dataset.name),
        ("kind", dataset.kind),
        ("uri", dataset.uri),
        ("format", dataset.format),
        ("shards", dataset.shard_count),
        ("bytes", dataset.size_bytes),
        ("samples", dataset.samples if dataset.samples is not None else "unknown"),
        ("records", getattr(dataset, "records", None)),
        ("sha256", dataset.sha256),
        ("created", dataset.created_at),
    ]


def _columns(pairs: list[str] | None) -> dict[str, str] | None:
    """``--column inputs=pixels --column targets=label`` as a mapping (usage error if bad)."""
    if not pairs:
        return None
    columns: dict[str, str] = {}
    for pair in pairs:
        role, sep, column = pair.partition("=")
        if not sep or role not in ("inputs", "targets") or not column:
            raise argparse.ArgumentTypeError(
                f"--column {pair!r}: expected inputs=<column> or targets=<column>"
            )
        columns[role] = column
    return columns


def cmd_register(args: argparse.Namespace) -> int:
    from ace3.cli.common import make_client

    try:
        columns = _columns(args.column)
    except argparse.ArgumentTypeError as exc:
        args.parser.error(str(exc))
    ref = make_client().datasets.register(
        args.uri,
        format=args.format,
        name=args.name,
        dtype=args.dtype,
        columns=columns,
        records=args.records,
    )
    if args.json:
        output.print_json(ref.dataset)
        return OK
    dataset = ref.dataset
    state = "registered" if ref.uploaded else "already registered"
    output.print_fields(f"dataset {dataset.id} ({state})", _fields(dataset))
    return OK


def cmd_upload(args: argparse.Namespace) -> int:
    from ace3.cli.common import make_client

    try:
        columns = _columns(args.column)
    except argparse.ArgumentTypeError as exc:
        args.parser.error(str(exc))
    ref = make_client().load_dataset(
        args.directory,
        args.name,
        format=args.format,
        dtype=args.dtype,
        columns=columns,
        records=args.records,
    )
    if args.json:
        output.print_json(ref.dataset)
        return OK
    dataset = ref.dataset
    state = "uploaded" if ref.uploaded else "already uploaded"
    output.print_fields(f"dataset {dataset.id} ({state})", _fields(dataset))
    return OK


def _shard_options(parser: argparse.ArgumentParser, name_default: str) -> None:
    """--format, --name, --dtype, --column and --records, as register and upload take them."""
    parser.add_argument("--format", required=True, choices=FORMATS, help="the shards' format")
    parser.add_argument("--name", default=None, help=f"a name (default: {name_default})")
    parser.add_argument(
        "--dtype", default=None, choices=("uint16", "uint32"), help="tokens: the ids' type"
    )
    parser.add_argument(
        "--column",
        action="append",
        metavar="ROLE=COLUMN",
        help="parquet: inputs=<column> or targets=<column> when not named so (repeatable)",
    )
    parser.add_argument(
        "--records",
        default=None,
        choices=RECORD_KINDS,
        help="jsonl: the kind of the shards' text records, for a Hugging Face model",
    )


def cmd_list(args: argparse.Namespace) -> int:
    from ace3.cli.common import make_client

    datasets: list[Any] = []
    for dataset in make_client().datasets.list(limit=min(args.limit, 100)):
        datasets.append(dataset)
        if len(datasets) >= args.limit:
            break
    if args.json:
        output.print_json(datasets)
        return OK
    output.print_table(
        None,
        ["ID", "NAME", "KIND", "FORMAT", "SHARDS", "BYTES", "SAMPLES", "CREATED"],
        [
            (d.id, d.name, d.kind, d.format, d.shard_count, d.size_bytes, d.samples, d.created_at)
            for d in datasets
        ],
    )
    return OK


def cmd_show(args: argparse.Namespace) -> int:
    from ace3.cli.common import make_client

    dataset = make_client().datasets.retrieve(args.id)
    if args.json:
        output.print_json(dataset)
        return OK
    output.print_fields(f"dataset {dataset.id}", _fields(dataset))
    return OK


def add_parsers(sub: Any) -> None:
    datasets = sub.add_parser("datasets", help="register, upload, list and inspect datasets")
    verbs = datasets.add_subparsers(dest="datasets_command", required=True)

    register = verbs.add_parser(
        "register",
        help="register the shards under an s3:// prefix the service may read as a dataset",
        description="Register the shards under an s3:// prefix (one of the service's "
        "ACE3_DATASET_SOURCES) as a dataset, without uploading them: the service lists them "
        "and streams them to the jobs that train on it. The same listing registered again is "
        "the same dataset; a changed one is a new dataset.",
    )
    register.add_argument("uri", help="s3://bucket/prefix/")
    _shard_options(register, "the prefix's last part")
    register.set_defaults(func=cmd_register, parser=register)

    upload = verbs.add_parser(
        "upload",
        help="upload a directory of shards as a dataset streamed to its jobs",
        description="Upload the shards in a local directory (its files with the format's "
        "endings, at any depth; their relative paths are their names) as a dataset: each is "
        "hashed and uploaded unless the service has it already, so running it again after an "
        "interruption uploads only what is missing. Jobs on it get its shards streamed as they "
        "read them, as for a registered dataset.",
    )
    upload.add_argument("directory", help="the directory of shards (or one shard file)")
    _shard_options(upload, "the directory's name")
    upload.set_defaults(func=cmd_upload, parser=upload)

    listing = verbs.add_parser("list", help="your datasets, newest first")
    listing.add_argument(
        "--limit", type=positive_int, default=20, help="at most this many (default 20)"
    )
    listing.set_defaults(func=cmd_list)

    show = verbs.add_parser("show", help="one dataset: kind, uri, format, shards, bytes, samples")
    show.add_argument("id", help="the dataset id")
    show.set_defaults(func=cmd_show)

    for parser in (register, upload, listing, show):
        add_json_flag(parser)
