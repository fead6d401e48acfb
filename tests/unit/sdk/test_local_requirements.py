"""An in-process run (``ace3.Trainer`` on a live module) checks ``config.requirements`` against
this Python before anything runs: an unmet entry raises ``UnmetRequirementsError`` naming it, an
entry the service would refuse ``UnsupportedFeatureError``; nothing is installed."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

import ace3
from ace3.trainers.in_process import check_local_requirements


def _train(requirements: list[str]) -> None:
    model = torch.nn.Linear(2, 2)
    data = torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))
    config = ace3.TrainingConfig(requirements=requirements, epochs=1, batch_size=2)
    ace3.Trainer(config).train(model, data)


def test_an_unmet_requirement_stops_the_run_before_training_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ace3.runtime.in_process as engine

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("training started")

    monkeypatch.setattr(engine, "train_in_process", never)
    torch_version = importlib.metadata.version("torch")
    with pytest.raises(ace3.UnmetRequirementsError) as caught:
        _train(["packaging", "ace3-no-such-package>=1", "torch==0.0.1"])
    assert caught.value.unmet == [
        "ace3-no-such-package is not installed (asked for 'ace3-no-such-package>=1')",
        f"torch {torch_version} is installed; 'torch==0.0.1' asks for another version",
    ]
    assert "ace3-no-such-package" in str(caught.value) and "installs nothing" in str(caught.value)
    assert isinstance(caught.value, ace3.ACE3Error)


def test_an_entry_the_service_would_refuse_is_refused_here_too() -> None:
    with pytest.raises(ace3.UnsupportedFeatureError) as caught:
        check_local_requirements(ace3.TrainingConfig(requirements=["-e ."]))
    assert [problem.field for problem in caught.value.problems] == ["requirements"]
    assert "'-e .'" in str(caught.value)


def test_met_requirements_and_false_markers_pass() -> None:
    torch_version = importlib.metadata.version("torch").split("+")[0]
    met = ["packaging>=20", f"torch>={torch_version}", "no-such-pkg; python_version < '3'"]
    check_local_requirements(ace3.TrainingConfig(requirements=met))
    check_local_requirements(ace3.TrainingConfig())
