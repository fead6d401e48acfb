"""``config.init_from = source`` after construction does what construction does: a stored
checkpoint (a handle or its id) becomes ``init_from_checkpoint_id``, a local path stays
``init_from``, the other field is cleared, a refused source raises construction's
ValidationError (naming ``init_from``) and leaves the config as it was, and assigning other
fields leaves both alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

import ace3

CHECKPOINT_ID = "0123456789abcdef0123456789abcdef"
OTHER_ID = "f" * 32
OTHERS: dict[str, Any] = {"epochs": 2, "learning_rate": 0.01, "freeze": ["0.*"]}

SOURCES = [
    pytest.param(ace3.Checkpoint(id=CHECKPOINT_ID, name="step-00000100.pt"), id="handle"),
    pytest.param(CHECKPOINT_ID, id="id"),
    pytest.param("weights/model.pt", id="path-string"),
    pytest.param(Path("weights/model.pt"), id="path"),
    pytest.param(Path(CHECKPOINT_ID), id="local-file-named-like-an-id"),
    pytest.param(None, id="none"),
]
EARLIER = [
    pytest.param({}, id="unset"),
    pytest.param({"init_from": OTHER_ID}, id="earlier-id"),
    pytest.param({"init_from_checkpoint_id": OTHER_ID}, id="earlier-checkpoint-id"),
    pytest.param({"init_from": "old.pt"}, id="earlier-path"),
]


@pytest.mark.parametrize("earlier", EARLIER)
@pytest.mark.parametrize("source", SOURCES)
def test_assigning_init_from_equals_construction(source: object, earlier: dict[str, Any]) -> None:
    config = ace3.TrainingConfig(**OTHERS, **earlier)
    config.init_from = source  # type: ignore[assignment]  # a handle or a Path, as at construction
    built = ace3.TrainingConfig(**OTHERS, init_from=source)
    assert config.model_dump() == built.model_dump()
    assert config.model_fields_set == built.model_fields_set
    assert config == built


@pytest.mark.parametrize("bad", [3, "   ", object(), "x" * 5000])
def test_a_refused_init_from_raises_constructions_error_and_changes_nothing(bad: object) -> None:
    config = ace3.TrainingConfig(**OTHERS, init_from="old.pt")
    before = config.model_dump()
    with pytest.raises(pydantic.ValidationError) as assigned:
        config.init_from = bad  # type: ignore[assignment]  # refused, as at construction
    with pytest.raises(pydantic.ValidationError) as constructed:
        ace3.TrainingConfig(**OTHERS, init_from=bad)
    errors = assigned.value.errors(include_url=False, include_context=False)
    assert errors == constructed.value.errors(include_url=False, include_context=False)
    assert [error["loc"] for error in errors] == [("init_from",)]
    assert config.model_dump() == before


def test_assigning_another_field_leaves_init_from_alone() -> None:
    """A local file named like an id stays a path when something else is assigned."""
    config = ace3.TrainingConfig(init_from=Path(CHECKPOINT_ID))
    config.epochs = 5
    assert (config.init_from, config.init_from_checkpoint_id) == (CHECKPOINT_ID, None)
    by_id = ace3.TrainingConfig(init_from=CHECKPOINT_ID)
    by_id.learning_rate = 0.5
    assert (by_id.init_from, by_id.init_from_checkpoint_id) == (None, CHECKPOINT_ID)
