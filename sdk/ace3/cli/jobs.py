"""``ace3 jobs list|show|logs|metrics|samples|cancel|download``: the job verbs, clients of
``/v1/jobs``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ace3.cli import output
from ace3.cli.common import add_json_flag, add_list_parser, cancel_run, list_runs, make_client
from ace3.cli.errors import BAD_INPUT, NOT_FOUND, OK, RUN_FAILED, CLIError
from ace3.config.events import EvalSamplesRecord


def _best_value(job: Any) -> str:
    metrics = job.final_metrics or {}
    for name in ("val_accuracy", "val_loss", "train_loss"):
        if isinstance(metrics.get(name), int | float):
            return f"{name}={metrics[name]:.4g}"
    return "-"


def cmd_list(args: argparse.Namespace) -> int:
    return list_runs(
        make_client().jobs,
        args,
        ["ID", "NAME", "STATE", "PROCS", "CREATED", "DURATION", "FINAL"],
        lambda job: (
            job.id,
            job.name,
            job.state,
            job.num_processes,
            job.created_at,
            output.duration(job.started_at, job.finished_at),
            _best_value(job),
        ),
    )


def cmd_show(args: argparse.Namespace) -> int:
    client = make_client()
    job = client.jobs.retrieve(args.id)
    if args.json:
        output.print_json(job)
        return OK
    output.print_fields(
        f"job {job.id}",
        [
            ("name", job.name),
            ("state", job.state),
            ("phase", job.phase),
            ("attempt", job.attempt),
            ("processes", job.num_processes),
            ("model", job.model_id),
            ("dataset", job.dataset_id),
            ("validation dataset", job.validation_dataset_id),
            ("fine-tuned model", job.fine_tuned_model_id),
            ("model kwargs", job.model_kwargs),
            ("created", job.created_at),
            ("started", job.started_at),
            ("finished", job.finished_at),
            ("duration", output.duration(job.started_at, job.finished_at)),
            ("final metrics", job.final_metrics),
            ("error", job.error),
            *environment_fields(job),
        ],
    )
    output.print_fields("config (fields not at their default)", sorted(changed_fields(job.config)))
    return OK


def environment_fields(job: Any) -> list[tuple[str, Any]]:
    """The packages the job adds to the worker's Python, and the environment they resolved to
    (``ace3 environments show HASH`` shows all of it)."""
    environment = job.environment
    packages = environment.packages if environment is not None else []
    return [
        ("requirements", ", ".join(job.requirements) if job.requirements else None),
        (
            "environment",
            f"{environment.hash} ({environment.state or 'gone'})" if environment else None,
        ),
        ("environment packages", ", ".join(f"{p.name} {p.version}" for p in packages) or None),
    ]


def changed_fields(config: dict[str, Any]) -> list[tuple[str, Any]]:
    """The config's fields whose value is not TrainingConfig's default."""
    from ace3.config import TrainingConfig

    defaults = TrainingConfig().model_dump(mode="json")
    return [(key, value) for key, value in config.items() if defaults.get(key, object()) != value]


def _log_text(line: Any) -> str:
    rank = f"[rank {line.rank}] " if line.rank is not None else ""
    return output.printable(f"{rank}{line.line}")


def cmd_logs(args: argparse.Namespace) -> int:
    from ace3.client.types import JobState, LogLine

    client = make_client()
    wanted = (lambda line: True) if args.rank is None else (lambda line: line.rank == args.rank)
    if not args.follow:
        lines = [line for line in client.jobs.iter_logs(args.id) if wanted(line)]
        if args.json:
            output.print_json(lines)
        else:
            for line in lines:
                print(_log_text(line))
        return OK
    client.jobs.retrieve(args.id)  # 404 before the stream opens: exit code 3
    for event in client.jobs.events(args.id):
        if isinstance(event.data, LogLine) and wanted(event.data):
            if args.json:
                output.print_json_line(event.data)
            else:
                print(_log_text(event.data), flush=True)
    job = client.jobs.retrieve(args.id)
    return OK if job.state == JobState.SUCCEEDED else RUN_FAILED


def cmd_metrics(args: argparse.Namespace) -> int:
    client = make_client()
    client.jobs.retrieve(args.id)  # an unknown job is exit code 3, not an empty table
    metrics = client.jobs.metrics(args.id, name=args.name)
    if args.json:
        output.print_json(metrics)
        return OK
    output.print_table(
        None,
        ["STEP", "EPOCH", "NAME", "VALUE"],
        [(metric.step, metric.epoch, metric.name, metric.value) for metric in metrics],
    )
    return OK


def cmd_samples(args: argparse.Namespace) -> int:
    """The latest completions of ``eval_prompts`` (an ``eval_samples`` record)."""
    page = make_client().jobs.record_page(args.id, type="eval_samples", order="newest", limit=1)
    if args.json:
        output.print_json([item.record for item in page.data])
        return OK
    if not page.data:
        print(f"job {args.id} has no eval_samples yet (eval_prompts: written at each validation)")
        return OK
    record = page.data[0].record
    if not isinstance(record, EvalSamplesRecord):
        raise CLIError(f"job {args.id}: an eval_samples record this SDK cannot read", RUN_FAILED)
    epoch = f", epoch {record.epoch:g}" if record.epoch is not None else ""
    print(f"eval samples at step {record.step}{epoch} (at most {record.max_new_tokens} tokens)")
    for sample in record.samples:
        cut = " (truncated)" if sample.truncated else ""
        print(f"\n> {sample.prompt}\n{sample.completion}{cut}")
    return OK


def cmd_cancel(args: argparse.Namespace) -> int:
    return cancel_run(make_client().jobs, args, "job")


def pick_checkpoint(checkpoints: list[Any], wanted: str, job_id: str) -> Any:
    """``latest`` (the highest step), ``best`` (keep_best_checkpoint's), or a name or id."""
    if not checkpoints:
        raise CLIError(f"job {job_id} has no checkpoint yet", NOT_FOUND)
    if wanted == "latest":
        return max(checkpoints, key=lambda item: (item.step or 0, str(item.created_at or "")))
    if wanted == "best":
        best = [item for item in checkpoints if item.best]
        if not best:
            raise CLIError(
                f"job {job_id} has no best checkpoint (it did not set keep_best_checkpoint): "
                "use --checkpoint latest or a name",
                NOT_FOUND,
            )
        return best[0]
    for item in checkpoints:
        if wanted in (item.name, item.id):
            return item
    names = ", ".join(item.name for item in checkpoints)
    raise CLIError(
        f"job {job_id} has no checkpoint {wanted!r}; it has: {names} (or latest, best)", NOT_FOUND
    )


def cmd_download(args: argparse.Namespace) -> int:
    client = make_client()
    client.jobs.retrieve(args.id)
    if args.artifacts or args.prefix:
        return _download_artifacts(client, args)
    checkpoint = pick_checkpoint(client.jobs.checkpoints(args.id), args.checkpoint, args.id)
    target = Path(args.output or ".")
    if (args.output or ".").endswith(("/", "\\")):
        target.mkdir(parents=True, exist_ok=True)
    elif not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
    path = client.jobs.download_checkpoint(args.id, checkpoint, target)
    if args.json:
        output.print_json({"path": str(path), "checkpoint": checkpoint})
    else:
        print(path)
    return OK


def _download_artifacts(client: Any, args: argparse.Namespace) -> int:
    """``--artifacts``: every artifact (or those under ``--prefix``) into ``-o`` (default: a
    directory named after the job), keeping their relative paths."""
    directory = Path(args.output or args.id)
    try:
        paths = client.jobs.download_artifacts(args.id, directory, prefix=args.prefix)
    except ValueError as exc:  # (a symbolic link in the way, or a bad --prefix)
        raise CLIError(str(exc), BAD_INPUT) from None
    if args.json:
        output.print_json({"directory": str(directory), "paths": [str(p) for p in paths]})
    elif not paths:
        print(
            f"job {args.id} has no artifacts" + (f" under {args.prefix!r}" if args.prefix else "")
        )
    else:
        for path in paths:
            print(path)
    return OK


def add_parsers(sub: Any) -> None:
    jobs = sub.add_parser("jobs", help="list, inspect, follow, cancel and download jobs")
    verbs = jobs.add_subparsers(dest="jobs_command", required=True)

    listing = add_list_parser(verbs, "job", " (e.g. running)")
    listing.set_defaults(func=cmd_list)

    show = verbs.add_parser("show", help="one job: state, timings, metrics, config")
    show.set_defaults(func=cmd_show)

    logs = verbs.add_parser("logs", help="a job's log lines (-f: follow until it ends)")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    logs.add_argument("--rank", type=int, default=None, help="only this rank's lines")
    logs.set_defaults(func=cmd_logs)

    metrics = verbs.add_parser("metrics", help="a job's metrics, by step")
    metrics.add_argument("--name", default=None, help="only this metric (e.g. val_loss)")
    metrics.set_defaults(func=cmd_metrics)

    samples = verbs.add_parser(
        "samples", help="the latest completions of a job's eval_prompts (at its last validation)"
    )
    samples.set_defaults(func=cmd_samples)

    cancel = verbs.add_parser("cancel", help="ask a job to stop")
    cancel.set_defaults(func=cmd_cancel)

    download = verbs.add_parser(
        "download", help="download one of a job's checkpoints, or (--artifacts) every artifact"
    )
    download.add_argument(
        "--checkpoint", default="latest", help="latest (default), best, or a name or id"
    )
    download.add_argument(
        "--artifacts",
        action="store_true",
        help="every artifact of the job (merged models, exports, TensorBoard files), keeping "
        "their relative paths under -o (default: a directory named after the job)",
    )
    download.add_argument(
        "--prefix", default=None, help="with --artifacts: only this file or directory"
    )
    download.add_argument(
        "-o",
        "--output",
        default=None,
        help="a file, or a directory to put the checkpoint in (default .); with --artifacts "
        "the directory to fill",
    )
    download.set_defaults(func=cmd_download)

    for parser in (show, logs, metrics, samples, cancel, download):
        parser.add_argument("id", help="the job id")
    for parser in (listing, show, logs, metrics, samples, cancel, download):
        add_json_flag(parser)
