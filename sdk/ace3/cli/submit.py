"""``ace3 train job.yaml`` and ``ace3 search search.yaml``: read the file (with overrides), then
submit through the SDK exactly as :class:`ace3.Trainer` and :func:`ace3.hyperparameter_search`
do (upload what the service lacks, create the job or search), and follow it with the SDK's
displays, or print its id at once with ``--detach``. A ``dataset: {id: ...}`` is the stored
dataset of that id (looked up first: nothing is uploaded for it)."""

from __future__ import annotations

import argparse
from typing import Any

from ace3.cli import output
from ace3.cli.common import make_client
from ace3.cli.dataset_entries import DatasetById
from ace3.cli.errors import NOT_FOUND, OK, RUN_FAILED, CLIError
from ace3.cli.jobfile import JobFile, load_job_file, load_search_file


def _model_ref(client: Any, spec: JobFile) -> Any:
    return client.load_model(
        spec.model.path, factory=spec.model.factory, entry_module=spec.model.entry_module
    )


def _stored(client: Any, entry: Any, key: str) -> Any:
    """A ``{id: ...}`` entry as the stored dataset (an unknown id is exit code 3, named by its
    key, before anything is uploaded); a path as it is (the SDK uploads it)."""
    from ace3.errors import NotFoundError

    if not isinstance(entry, DatasetById):
        return entry
    try:
        return client.datasets.retrieve(entry.id)
    except NotFoundError:
        raise CLIError(
            f"{key}.id: no dataset {entry.id} among yours (`ace3 datasets list` shows them)",
            NOT_FOUND,
        ) from None


def _datasets(client: Any, spec: JobFile) -> tuple[Any, Any]:
    """(dataset, validation_dataset) of ``spec`` as the SDK takes them."""
    return (
        _stored(client, spec.dataset, "dataset"),
        _stored(client, spec.validation_dataset, "validation_dataset"),
    )


def cmd_train(args: argparse.Namespace) -> int:
    from ace3.errors import JobCancelledError, JobFailedError
    from ace3.follow.job_handle import JobHandle
    from ace3.trainers import Trainer

    spec = load_job_file(args.file, args.overrides)
    client = make_client()
    trainer = Trainer(spec.training, client=client)
    show = None if args.json else True
    dataset, validation_dataset = _datasets(client, spec)
    try:
        outcome = trainer.train(
            _model_ref(client, spec),
            dataset,
            validation_dataset=validation_dataset,
            model_kwargs=spec.model.kwargs or None,
            name=spec.name,
            wait=not args.detach,
            show_progress=show,
        )
    except (JobFailedError, JobCancelledError) as exc:
        if args.json and trainer.last_job is not None:
            output.print_json(trainer.last_job.job)
        output.note(f"ace3: {exc}")
        return RUN_FAILED
    if isinstance(outcome, JobHandle):  # (--detach)
        if args.json:
            output.print_json(outcome.job)
        else:
            print(outcome.id)
        return OK
    job = trainer.last_job.job if trainer.last_job is not None else None
    if args.json:
        output.print_json(job)
    else:
        print(f"job {outcome.job_id} succeeded")
        if outcome.final_metrics:
            print("final metrics: " + output.cell(dict(outcome.final_metrics)))
        if outcome.checkpoints:
            print(f"checkpoints: {len(outcome.checkpoints)} (ace3 jobs download {outcome.job_id})")
    return OK


def cmd_search(args: argparse.Namespace) -> int:
    from ace3.errors import SearchCancelledError, SearchFailedError
    from ace3.trainers.hyperparameter_search import hyperparameter_search

    spec = load_search_file(args.file, args.overrides)
    client = make_client()
    assert spec.hp_config is not None
    dataset, validation_dataset = _datasets(client, spec)
    try:
        outcome: Any = hyperparameter_search(
            _model_ref(client, spec),
            dataset,
            spec.hp_config,
            validation_dataset=validation_dataset,
            model_kwargs=spec.model.kwargs or None,
            name=spec.name,
            client=client,
            wait=not args.detach,
            show_progress=None if args.json else True,
        )
    except (SearchFailedError, SearchCancelledError) as exc:
        if args.json:
            output.print_json(exc.search)
        output.note(f"ace3: {exc}")
        return RUN_FAILED
    if args.detach:
        if args.json:
            output.print_json(outcome.search)
        else:
            print(outcome.id)
        return OK
    result = outcome.result
    if args.json:
        output.print_json(client.searches.retrieve(result.search_id))
    else:
        print(f"search {result.search_id} finished")
        print(f"best {output.cell(result.objective)}: {output.cell(result.best_value)}")
        print(f"best parameters: {output.cell(result.best_params or {})}")
        if result.best_job_id:
            print(f"best trial's job: {result.best_job_id}")
    return OK


def add_parsers(sub: Any) -> None:
    from ace3.cli.common import add_json_flag

    train = sub.add_parser(
        "train",
        help="train from a YAML job file (key=value overrides)",
        description="Submit a training job from a YAML job file and follow it. Overrides are "
        "dotted keys: training.learning_rate=3e-4 model.kwargs.hidden=128.",
    )
    search = sub.add_parser(
        "search",
        help="run a hyperparameter search from a YAML file (key=value overrides)",
        description="Start a hyperparameter search from a YAML search file and follow it. "
        "Overrides are dotted keys: search.max_trials=4 training.epochs=2.",
    )
    for parser, func, what in ((train, cmd_train, "job"), (search, cmd_search, "search")):
        parser.add_argument("file", help=f"the YAML {what} file")
        parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
        parser.add_argument(
            "--detach", action="store_true", help=f"print the {what} id and exit without following"
        )
        add_json_flag(parser)
        parser.set_defaults(func=func)
