"""``ace3.hyperparameter_search``: run a search on the ACE3 service and return the best
parameters.

::

    hp_config = ace3.HPConfig(
        search_space={
            "learning_rate": ace3.hp.loguniform(1e-5, 1e-2),
            "batch_size": ace3.hp.choice([16, 32, 64, 128]),
        },
        algorithm="bayesian",
        max_trials=50,
        objective="val_accuracy",
        direction="maximize",
    )
    best_params = ace3.hyperparameter_search(model=model, dataset=dataset, config=hp_config)
    print(best_params)                      # {'learning_rate': 0.00042, 'batch_size': 64}
    best_params.result.best_checkpoint      # and every trial: best_params.result.trials

Every trial is an ordinary job on the service; Optuna runs there, not here. What the engine
does not implement, and values no trial could run with, are refused before anything is
uploaded or submitted.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ace3.config.search_checks import search_space_problems
from ace3.errors import UnsupportedFeatureError
from ace3.follow.search_handle import BestParams, SearchHandle
from ace3.hp import (
    HPConfig,
)
from ace3.trainers._submit import (
    refuse_local_only,
    resolve_inputs,
    without_rendezvous,
)
from ace3.trainers.teacher_weights import upload_teacher_weights
from ace3.trainers.weights import upload_local_weights

if TYPE_CHECKING:
    from ace3.client import Client

__all__ = ["hyperparameter_search"]


def hyperparameter_search(
    model: Any = None,
    dataset: Any = None,
    config: HPConfig | None = None,
    *,
    validation_dataset: Any = None,
    model_kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
    client: Client | None = None,
    wait: bool = True,
    show_progress: bool | None = True,
    idempotency_key: str | None = None,
) -> BestParams | SearchHandle:
    """Search hyperparameters on the ACE3 service and return the best ones.

    ``model``: a :class:`~ace3.client.ModelRef` from ``client.load_model`` (or a path,
    loaded here); ``dataset`` and ``validation_dataset``: a :class:`~ace3.client.DatasetRef`
    or a path. ``config``: an :class:`~ace3.HPConfig` (what to search, how, and the
    ``base_config`` every trial starts from). ``model_kwargs`` go to the model factory of
    every trial; a searched ``model.<name>`` overrides the same name there.

    Follows the search with a live table of its trials (plain lines when stdout is not a
    terminal or ``show_progress=False``) and returns :class:`~ace3.follow.search_handle.BestParams`:
    a dict of the best trial's parameters, with ``.result`` (a
    :class:`~ace3.follow.search_handle.SearchResult`: every trial, the best value, the best
    trial's checkpoint) and ``.search_id``. Raises :class:`~ace3.errors.SearchFailedError`
    when too many trials failed, :class:`~ace3.errors.SearchCancelledError` when it was
    cancelled. Ctrl-C while waiting cancels the search. ``wait=False`` returns a
    :class:`~ace3.follow.search_handle.SearchHandle` at once. ``idempotency_key`` (a new uuid4 by
    default) makes a retried submission return the same search.
    """
    if config is None:
        raise TypeError(
            "config is required: pass config=ace3.HPConfig(search_space={...}, max_trials=..., "
            "objective=..., direction=...)"
        )
    if not isinstance(config, HPConfig):
        raise TypeError(
            f"config must be an ace3.HPConfig, not {type(config).__name__}: "
            "e.g. ace3.HPConfig(search_space={'learning_rate': ace3.hp.loguniform(1e-5, 1e-2)})"
        )
    check_search(config)
    base_config = without_rendezvous(config.base_config, stacklevel=2)
    if base_config is not config.base_config:
        config = config.model_copy(update={"base_config": base_config})
    if model is None:
        raise ValueError("model is required: pass client.load_model('model.py') or a path")
    if dataset is None:
        raise ValueError("dataset is required: pass client.load_dataset(...) or a path")

    refuse_local_only(base_config)  # before any upload
    client, ids = resolve_inputs(client, model, dataset, validation_dataset)
    uploaded = upload_teacher_weights(upload_local_weights(config.base_config, client), client)
    if uploaded is not config.base_config:
        config = config.model_copy(update={"base_config": uploaded})
    search = client.searches.create(
        **ids,
        config=config,
        model_kwargs=model_kwargs,
        name=name,
        idempotency_key=idempotency_key or str(uuid.uuid4()),
    )
    handle = SearchHandle(search, client)
    if not wait:
        return handle
    result = handle.wait(show_progress=show_progress, cancel_on_interrupt=True)
    if result.best_trial is None:
        warnings.warn(
            f"search {result.search_id} ended without a succeeded trial to call best: "
            "the parameters are empty (see .result.trials)",
            UserWarning,
            stacklevel=2,
        )
    return BestParams(result.best_params, result)


# -- checks before anything is sent ---------------------------------------------------------


def check_search(config: HPConfig) -> None:
    """Refuse a search no trial could run, before any request (the API answers 422 the same way).

    :class:`~ace3.errors.UnsupportedFeatureError` lists every setting the engine does not
    implement yet, in ``base_config`` or among the searched values; ``ValueError`` names
    searched values a TrainingConfig field does not accept (e.g. a learning rate of 0, or
    floats for an integer field).
    """
    problems, invalid = search_space_problems(config)
    if problems:
        raise UnsupportedFeatureError(
            "this search asks for settings the training engine does not implement yet:\n"
            + "\n".join(f"  - {problem.reason}" for problem in problems),
            problems,
        )
    if invalid:
        raise ValueError(
            "the search space holds values no trial can run with:\n  - " + "\n  - ".join(invalid)
        )
