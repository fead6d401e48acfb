"""The OpenAI-compatible API's mappings (request -> TrainingConfig, ACE3 states -> statuses) and
its error shape, without a server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import HTTPException
from pydantic import ValidationError

from ace3.config.states import JobState
from ace3_server.openai_api.errors import OpenAIError, openai_error_response, param_of
from ace3_server.openai_api.mapping import (
    FULL_BASE_LEARNING_RATE,
    LORA_BASE_LEARNING_RATE,
    FineTuningJobCreate,
    resolved_hyperparameters,
    status_of,
    training_config,
)
from ace3_server.openai_api.objects import trained_tokens
from ace3_server.openai_api.results import csv_cell


def _body(**fields: Any) -> FineTuningJobCreate:
    return FineTuningJobCreate(model="m", training_file="f", **fields)


def test_every_ace3_state_has_an_openai_status() -> None:
    statuses = {state: status_of(state) for state in JobState}
    assert statuses == {
        "queued": "queued", "starting": "validating_files", "running": "running",
        "cancelling": "running", "succeeded": "succeeded", "failed": "failed",
        "cancelled": "cancelled",
    }  # fmt: skip


def test_auto_hyperparameters_take_the_documented_defaults_with_lora() -> None:
    config = training_config(_body(hyperparameters={"n_epochs": "auto"}))
    assert config.epochs is None and config.batch_size == 8
    assert config.learning_rate == LORA_BASE_LEARNING_RATE
    assert config.lora is not None and config.lora.target_modules == "all-linear"
    resolved = resolved_hyperparameters(config.model_dump(mode="json"))
    assert resolved == {"n_epochs": 3, "batch_size": 8, "learning_rate_multiplier": 1.0}


def test_hyperparameters_map_and_full_fine_tuning_is_asked_for_in_ace3() -> None:
    method = {"type": "supervised", "supervised": {"hyperparameters": {
        "n_epochs": 2, "batch_size": 16, "learning_rate_multiplier": 3}}}  # fmt: skip
    config = training_config(_body(method=method, seed=0, ace3={"lora": None, "max_steps": 9}))
    assert (config.epochs, config.batch_size, config.seed, config.max_steps) == (2, 16, 0, 9)
    assert config.lora is None and config.learning_rate == pytest.approx(
        3 * FULL_BASE_LEARNING_RATE
    )
    assert resolved_hyperparameters(config.model_dump(mode="json"))["learning_rate_multiplier"] == 3


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"hyperparameters": {"warmup": 1}}, "hyperparameters.warmup"),
        ({"hyperparameters": {"n_epochs": 0}}, "hyperparameters.n_epochs"),
        ({"hyperparameters": {"batch_size": 1.5}}, "hyperparameters.batch_size"),
        ({"hyperparameters": {"n_epochs": 10**12}}, "hyperparameters.n_epochs"),
        ({"hyperparameters": {"n_epochs": 51}}, "hyperparameters.n_epochs"),
        ({"hyperparameters": {"batch_size": 257}}, "hyperparameters.batch_size"),
        ({"hyperparameters": {"learning_rate_multiplier": float("nan")}},
         "hyperparameters.learning_rate_multiplier"),
        ({"method": {"type": "supervised", "supervised": {"hyperparameters": {
            "learning_rate_multiplier": float("inf")}}}},
         "method.supervised.hyperparameters.learning_rate_multiplier"),
        ({"method": {"type": "dpo"}}, "method.type"),
        ({"method": {"type": "supervised", "supervised": {"hyperparameters": {"x": 1}}}},
         "method.supervised.hyperparameters.x"),
        ({"hyperparameters": {}, "method": {"type": "supervised", "supervised": {
            "hyperparameters": {}}}}, "hyperparameters"),
        ({"ace3": {"max_steps": 0}}, "ace3.max_steps"),
        ({"ace3": {"nonsense": 1}}, "ace3.nonsense"),
        ({"ace3": {"epochs": 2}, "hyperparameters": {"n_epochs": 3}}, "ace3.epochs"),
    ],
)  # fmt: skip
def test_a_bad_request_is_a_400_naming_its_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        training_config(_body(**fields))
    assert (refused.value.status_code, refused.value.param) == (400, param)


def test_errors_have_openais_shape() -> None:
    ace3_422 = HTTPException(422, detail=[{"loc": ["body", "config", "max_steps"], "msg": "bad"}])
    response = openai_error_response(ace3_422)
    assert response.status_code == 400
    assert json.loads(response.body) == {"error": {
        "message": "ace3.max_steps: bad", "type": "invalid_request_error",
        "param": "ace3.max_steps", "code": None}}  # fmt: skip
    unauthorized = json.loads(openai_error_response(HTTPException(401, detail="no key")).body)
    assert unauthorized["error"]["code"] == "invalid_api_key"
    assert openai_error_response(HTTPException(500, detail="x")).status_code == 500
    assert param_of(["query", "after"]) == "after"


def test_openais_largest_hyperparameters_are_taken() -> None:
    hyperparameters = {"n_epochs": 50, "batch_size": 256, "learning_rate_multiplier": 1000}
    config = training_config(_body(hyperparameters=hyperparameters))
    assert (config.epochs, config.batch_size) == (50, 256)


@pytest.mark.parametrize(
    "metadata",
    [{f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513}, {"k": 1}],
)
def test_metadata_past_openais_limits_is_refused(metadata: dict[str, Any]) -> None:
    with pytest.raises(ValidationError) as refused:
        _body(metadata=metadata)
    assert refused.value.errors()[0]["loc"][0] == "metadata"
    assert _body(metadata={f"k{i}": "v" * 512 for i in range(16)}).metadata


def test_a_csv_cell_never_starts_a_formula_but_a_number_is_kept() -> None:
    assert [csv_cell(text) for text in ("=1+2", "+x", "-x", "@SUM(A1)", "\tx", "\rx")] == [
        "'=1+2", "'+x", "'-x", "'@SUM(A1)", "'\tx", '"\'\rx"']  # fmt: skip
    assert [csv_cell(text) for text in ("-1.25", "+2", "1e-05", "train_loss")] == [
        "-1.25", "+2", "1e-05", "train_loss"]  # fmt: skip
    assert csv_cell('a,"b"') == '"a,""b"""'
    assert trained_tokens({"trained_tokens": 1234.0}) == 1234 and trained_tokens(None) is None
