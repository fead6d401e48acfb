"""What ``Trainer.train`` returns, as the type checker sees it (``make test`` runs mypy on this
file; tests/unit/sdk/test_trainer_types.py runs the same calls and checks the runtime types).

``typing.assert_type`` is a no-op at run time and an error for the checker when the inferred
type differs: a change to the overloads that loses a return type fails ``make test``.
"""

from __future__ import annotations

from typing import Any, assert_type

import ace3
from ace3.client import ModelRef
from ace3.client.handles import FinishedJob, FinishedSearch
from ace3.trainers.in_process import LocalTrainingResult


def remote_returns_a_training_result(trainer: ace3.Trainer, model: ModelRef, data: Any) -> None:
    assert_type(trainer.train(model, data), ace3.TrainingResult)
    assert_type(trainer.train("model.py", data, epochs=1), ace3.TrainingResult)


def remote_without_waiting_returns_a_handle(trainer: ace3.Trainer, model: ModelRef) -> None:
    assert_type(trainer.train(model, "data.npz", wait=False), ace3.JobHandle)


def remote_with_a_runtime_flag_returns_either(
    trainer: ace3.Trainer, model: ModelRef, wait: bool
) -> None:
    assert_type(trainer.train(model, "data.npz", wait=wait), ace3.TrainingResult | ace3.JobHandle)


def in_process_returns_a_local_result(trainer: ace3.Trainer, data: Any) -> LocalTrainingResult:
    import torch

    module: torch.nn.Module = torch.nn.Linear(2, 2)
    # (mypy never reads torch: ``torch.nn.Module`` is Any to it; pyright resolves this overload)
    result: LocalTrainingResult = trainer.train(module, data)
    return result


def client_handles_are_the_promised_interfaces(client: ace3.Client) -> None:
    # (ace3.follow registers JobHandle/SearchHandle; the checker verifies they conform)
    assert_type(client.job("job_1").wait(), FinishedJob)
    assert_type(client.search("search_1").wait(), FinishedSearch)
