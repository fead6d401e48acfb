"""What trainers and searches share before they submit: the client to use, the ids of the
model and datasets (uploading paths), and the check that a TrainingConfig only asks for what
the engine implements."""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, TypedDict

from ace3.client.types import Dataset, Model
from ace3.config import ConfigProblem, TrainingConfig, unsupported_settings
from ace3.config.optimizer_choice import is_class_name
from ace3.errors import UnsupportedFeatureError

if TYPE_CHECKING:
    from ace3.client import Client, DatasetRef, ModelRef

RENDEZVOUS_FIELDS = ("node_rank", "master_addr", "master_port")


def resolve_client(explicit: Client | None, *inputs: Any) -> Client:
    """``explicit`` if given, else the client that loaded one of ``inputs`` (a ModelRef or
    DatasetRef), else the default client."""
    if explicit is not None:
        return explicit
    for value in inputs:
        bound = getattr(value, "client", None)
        if bound is not None and hasattr(bound, "jobs"):
            return bound
    from ace3.client import get_default_client

    return get_default_client()


def model_id(model: ModelRef | Model | str | os.PathLike[str], client: Client) -> str:
    """The id of ``model``: a ModelRef or Model, or a path uploaded with ``client``."""
    from ace3.client import ModelRef

    if isinstance(model, ModelRef | Model):
        return model.id
    if isinstance(model, str | os.PathLike):
        return client.load_model(model).id
    raise TypeError(
        f"model must be what client.load_model() returns, or a path to a .py file; got "
        f"{type(model).__name__}. ACE3 trains remotely: it uploads model code, not objects"
    )


def dataset_id(
    dataset: DatasetRef | Dataset | str | os.PathLike[str], client: Client, what: str
) -> str:
    """The id of ``dataset``: a DatasetRef or Dataset, or a path uploaded with ``client``."""
    from ace3.client import DatasetRef

    if isinstance(dataset, DatasetRef | Dataset):
        return dataset.id
    if isinstance(dataset, str | os.PathLike):
        return client.load_dataset(dataset).id
    raise TypeError(
        f"{what} must be what client.load_dataset() returns, or a path; got "
        f"{type(dataset).__name__}. ACE3 trains remotely: it uploads data files, not objects"
    )


class RunInputs(TypedDict):
    """The ids a job or search request names its model and datasets by."""

    model_id: str
    dataset_id: str
    validation_dataset_id: str | None


def resolve_inputs(
    explicit: Client | None, model: Any, dataset: Any, validation_dataset: Any
) -> tuple[Client, RunInputs]:
    """The client, and the ids of the model and datasets (uploading paths, in that order), as
    the ``model_id``/``dataset_id``/``validation_dataset_id`` of a job or search request."""
    client = resolve_client(explicit, model, dataset, validation_dataset)
    ids: RunInputs = {
        "model_id": model_id(model, client),
        "dataset_id": dataset_id(dataset, client, "dataset"),
        "validation_dataset_id": (
            dataset_id(validation_dataset, client, "validation_dataset")
            if validation_dataset is not None
            else None
        ),
    }
    return client, ids


def refuse_unsupported(config: TrainingConfig, *, what: str = "this config") -> None:
    """Raise :class:`~ace3.errors.UnsupportedFeatureError` listing every setting of
    ``config`` the engine does not implement yet."""
    problems = unsupported_settings(config) + _optimizer_kwargs_problems(config)
    if problems:
        raise UnsupportedFeatureError(
            f"{what} asks for settings the training engine does not implement yet:\n"
            + "\n".join(f"  - {problem.reason}" for problem in problems),
            problems,
        )


def _optimizer_kwargs_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """A class-name optimizer's ``optimizer_kwargs`` values, checked by the class itself on a
    stand-in parameter when torch is already imported here (so a remote job does not fail at
    build for them); without torch the engine checks them."""
    torch = sys.modules.get("torch")
    if torch is None or not is_class_name(config.optimizer) or not config.optimizer_kwargs:
        return []
    cls = getattr(torch.optim, config.optimizer, None)
    if cls is None:
        return []
    kwargs = {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in config.optimizer_kwargs.items()
    }
    try:
        cls([torch.nn.Parameter(torch.zeros(1))], lr=config.learning_rate, **kwargs)
    except (TypeError, ValueError) as exc:
        reason = f"optimizer_kwargs {config.optimizer_kwargs!r}: torch.optim.{config.optimizer} refused them: {exc}"
        return [ConfigProblem(field="optimizer_kwargs", reason=reason)]
    return []


def refuse_local_only(config: TrainingConfig) -> None:
    """Raise :class:`~ace3.errors.UnsupportedFeatureError` when ``config`` holds what only an
    in-process run can use (a live teacher module, a local teacher weights file): a remote job
    receives ids, so these would be lost on the way."""
    reasons = config.distillation.local_only_parts() if config.distillation is not None else []
    if reasons:
        problems = [ConfigProblem(field="distillation", reason=reason) for reason in reasons]
        raise UnsupportedFeatureError(
            "a remote job cannot use these distillation settings:\n"
            + "\n".join(f"  - {reason}" for reason in reasons),
            problems,
        )


def without_rendezvous(config: TrainingConfig, *, stacklevel: int = 3) -> TrainingConfig:
    """``config`` without the local-launch rendezvous settings (with a warning when any was
    set): the service assigns ranks and the rendezvous address itself.

    ``num_nodes`` is kept: the service runs the job on that many workers, which meet through
    torchrun's c10d rendezvous at an address the first of them picks. ``node_rank``,
    ``master_addr`` and ``master_port`` describe one machine of a launch the user runs by hand
    (``torchrun --node-rank ... --master-addr ...``), so a remote job has no use for them."""
    rendezvous = [name for name in RENDEZVOUS_FIELDS if getattr(config, name) is not None]
    if not rendezvous:
        return config
    warnings.warn(
        f"{', '.join(rendezvous)} only apply to local launches: the ACE3 service "
        "assigns ranks and the rendezvous address itself, so they are not sent",
        UserWarning,
        stacklevel=stacklevel + 1,
    )
    return config.model_copy(update=dict.fromkeys(rendezvous))
