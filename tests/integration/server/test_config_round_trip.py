"""Every config section, with its defaults and with each documented example (docs/ and the
README), gets the same verdict in process and from the real API: both accept it, or both refuse
it naming the same field. Accepted configs are sent as the client sends them (the fields the
user set, ``exclude_unset``) and with every default filled in (``model_dump``): a validator
that depends on which fields were set would tell them apart. Jobs are only created (queued on a
queue no worker reads), never run; searches likewise (the API's search driver is off).

Also the bug of issue 26: ``QuantizationConfig(precision="int8")`` was accepted in process and
refused by the API (422 "calibration_steps is for method='static'"), because the client sent
the default ``calibration_steps`` as if set."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pydantic
import pytest
from pydantic import BaseModel

import ace3
from ace3.config import TrainingConfig, unsupported_settings
from ace3.config.search_checks import search_space_problems
from ace3.config.specs import CallbackSpec, ProfilerSpec, SchedulerSpec, TensorBoardSpec
from ace3.hp import HPConfig
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.settings import Settings
from tests.conftest import fresh_database, insert_job
from tests.integration.server.in_process_api import add_key, serve


class Case(NamedTuple):
    """A TrainingConfig field holding the section, the section's data, other fields it needs."""

    field: str
    section: Any
    others: dict[str, Any] = {}
    refused: bool = False  # what the docs say of it (both sides must agree, and with this)


TEACHER = "<the stored model's id>"  # replaced by the test's stored model

# Every pydantic model reachable from TrainingConfig, with its defaults (the fewest fields it
# needs) and each documented example. A section added to TrainingConfig without a row fails
# test_the_table_covers_every_section.
SECTIONS: dict[type[BaseModel], list[Case]] = {
    TrainingConfig: [
        Case("epochs", 3),  # TrainingConfig() itself: every default
        Case("num_gpus", 4, {"zero_stage": 3, "mixed_precision": True}),  # docs/parallelism.md
        Case("parallelism", "pipeline", {"num_stages": 2}),  # the document's pipeline example
        Case(
            "cpu_offload", True, {"zero_stage": 1}, refused=True
        ),  # refused: offload needs ZeRO 2 or 3
        Case("optimizer_kwargs", {"eps": [None, 1e-3]}, {"optimizer": "Adafactor"}),
        Case(
            "optimizer_kwargs", {"rho": "0.9"}, {"optimizer": "Adadelta"}, refused=True
        ),  # refused: a string where torch takes a number
    ],
    ace3.QuantizationConfig: [
        Case("quantization", {}),
        Case("quantization", {"precision": "int8"}),  # issue 26: was refused by the API only
        Case("quantization", {"precision": "int8", "method": "static", "calibration_steps": 100}),
        Case(
            "quantization", {"method": "dynamic", "calibration_steps": 10}, refused=True
        ),  # refused
    ],
    ace3.PruningConfig: [
        Case("pruning", {"target_sparsity": 0.5}),
        Case(
            "pruning",
            {
                "target_sparsity": 0.5,
                "schedule": "cubic",
                "begin_step": 100,
                "end_step": 1000,
                "frequency": 10,
                "scope": "global",
            },
        ),
        Case(
            "pruning", {"target_sparsity": 0.5, "schedule": "oneshot", "end_step": 9}, refused=True
        ),
    ],
    ace3.LoRAConfig: [
        Case("lora", {"target_modules": ["fc1"]}),
        Case(
            "lora",
            {
                "r": 8,
                "lora_alpha": 16,
                "lora_dropout": 0.05,
                "target_modules": ["fc1", "fc2"],
                "bias": "none",
            },
        ),
        Case("lora", {"r": 8, "lora_alpha": 0.08, "target_modules": ["*"]}),
        Case("lora", {"target_modules": ["fc1"]}, {"zero_stage": 3}),  # FSDP2 shards the base too
        Case(
            "lora",
            {"target_modules": ["fc1"]},
            {"num_gpus": 2, "tensor_parallel_size": 2},
            refused=True,
        ),
    ],
    ace3.DistillationConfig: [
        Case("distillation", {"teacher_model_id": TEACHER}),
        Case(
            "distillation",
            {
                "teacher_model_id": TEACHER,
                "teacher_model_kwargs": {"hidden": 512},
                "temperature": 2.0,
                "alpha": 0.5,
                "feature_layers": {"3": "5"},
                "feature_loss_weight": 0.1,
                "hidden_loss": "cosine",
                "attention_loss_weight": 0.0,
            },
            {"num_gpus": 2},
        ),
    ],
    ace3.InstabilityConfig: [
        Case("instability", {}),
        Case(
            "instability",
            {
                "action": "rollback",
                "window": 100,
                "explosion_factor": 2.0,
                "max_grad_norm_spike": 50.0,
                "lr_factor": 0.5,
                "max_rollbacks": 3,
            },
            {"save_interval": 200},
        ),
        Case(
            "instability", {"action": "rollback"}, refused=True
        ),  # refused: no checkpoints to roll back to
    ],
    ace3.DynamicBatchSizeConfig: [
        Case("dynamic_batch_size", {}),
        Case(
            "dynamic_batch_size",
            {
                "initial_batch_size": 32,
                "target_batch_size": 128,
                "min_batch_size": 8,
                "growth_factor": 2,
                "shrink_factor": 0.5,
                "stable_steps": 100,
                "scale_learning_rate": "sqrt",
            },
        ),
    ],
    SchedulerSpec: [
        Case("lr_scheduler", {"name": "cosine"}),
        Case(
            "lr_scheduler",
            {"name": "warmup_cosine", "params": {"warmup_steps": 500, "min_lr": 1e-6}},
        ),
        Case("lr_scheduler", {"name": "warmup_cosine", "params": {"warmup_steps": 100}}),
        Case(
            "lr_scheduler", {"name": "cosine", "params": {"tmax": 10}}, refused=True
        ),  # refused: unknown
    ],
    CallbackSpec: [
        Case("callbacks", [{"kind": "builtin", "name": "EarlyStopping"}]),
        Case(
            "callbacks", [{"kind": "builtin", "name": "EarlyStopping", "params": {"patience": 3}}]
        ),
        Case("callbacks", [{"kind": "source", "name": "Mine"}], refused=True),  # no source
    ],
    TensorBoardSpec: [
        Case("tensorboard", {}),
        Case("tensorboard", {"log_histograms": True}),
        Case(
            "tensorboard", {"log_graph": True}, {"zero_stage": 3}, refused=True
        ),  # refused: sharded
    ],
    ProfilerSpec: [
        Case("profiler", {}),
        Case(
            "profiler",
            {"activities": ["cpu", "cuda"], "record_shapes": True, "profile_memory": True},
        ),
    ],
}

# The search config the API takes (POST /v1/searches): its fewest fields and the README's example.
SEARCHES: list[dict[str, Any]] = [
    {"search_space": {"learning_rate": {"type": "loguniform", "low": 1e-5, "high": 1e-2}}},
    {
        "search_space": {
            "learning_rate": {"type": "loguniform", "low": 1e-5, "high": 1e-2},
            "batch_size": {"type": "choice", "options": [16, 32, 64, 128]},
            "weight_decay": {"type": "uniform", "low": 0.0, "high": 0.1},
            "dropout": {"type": "uniform", "low": 0.1, "high": 0.5},
        },
        "max_trials": 3,
    },
    {  # a quantized base: the same bug through a search
        "search_space": {"learning_rate": {"type": "loguniform", "low": 1e-5, "high": 1e-2}},
        "base_config": {"quantization": {"precision": "int8"}},
    },
    {"search_space": {"learning_rate": {"type": "uniform", "low": 0.0, "high": 1.0}}},  # refused
]


class Verdict(NamedTuple):
    accepted: bool
    fields: frozenset[str]  # the top-level config fields a refusal names


def _reachable_models() -> set[type[BaseModel]]:
    found: set[type[BaseModel]] = {TrainingConfig}
    todo: list[Any] = [field.annotation for field in TrainingConfig.model_fields.values()]
    while todo:
        annotation = todo.pop()
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in found:
                found.add(annotation)
                todo.extend(field.annotation for field in annotation.model_fields.values())
        else:
            todo.extend(getattr(annotation, "__args__", ()))
    return found


def test_the_table_covers_every_section() -> None:
    assert _reachable_models() == set(SECTIONS)


def _in_process(data: dict[str, Any]) -> tuple[Verdict, TrainingConfig | None]:
    try:
        config = TrainingConfig(**data)
    except pydantic.ValidationError as exc:
        return Verdict(False, frozenset(str(error["loc"][0]) for error in exc.errors())), None
    problems = unsupported_settings(config)
    return Verdict(not problems, frozenset(p.field.split(".")[0] for p in problems)), config


def _api_verdict(response: httpx.Response, where: str) -> Verdict:
    if response.status_code in (200, 201):
        return Verdict(True, frozenset())
    assert response.status_code == 422, response.text
    locs = [error["loc"] for error in response.json()["detail"]]
    assert all(loc[:2] == ["body", where] for loc in locs), locs
    return Verdict(False, frozenset(str(loc[2]).split(".")[0] for loc in locs))


class API(NamedTuple):
    http: httpx.Client
    base_url: str
    key: str
    model_id: str
    dataset_id: str


@pytest.fixture(scope="module")
def own_database_url() -> Iterator[str]:
    """A database of this module's own: the jobs it accepts stay queued, and in the run's shared
    database the stack's reconciler would republish them to the stack's workers after a minute
    (each failing there on a model that is not in storage) and they would crowd the reconciler's
    batch of stale queued jobs that other tests count on."""
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def api(
    own_database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[API]:
    database_url = own_database_url
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        job = insert_job(session, state="cancelled")  # an owner with a model and a dataset
        key, _ = add_key(session, job.owner_id)
        refs = (job.model_id, job.dataset_id)
    engine.dispose()
    settings = Settings(
        data_dir=Path(tmp_path_factory.mktemp("round-trip")),
        database_url=database_url,
        broker_url=redis_url,
        queue_name=f"ace3-round-trip-{secrets.token_hex(4)}",  # no worker reads it
    )
    with (
        serve(settings) as (_, base_url),
        httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}) as http,
    ):
        yield API(http, base_url, key, *refs)


def _post_job(api: API, config: dict[str, Any]) -> httpx.Response:
    body = {"model_id": api.model_id, "dataset_id": api.dataset_id, "config": config}
    return api.http.post("/v1/jobs", json=body)


def _cases() -> list[Any]:
    return [
        pytest.param(case, id=f"{model.__name__}-{index}")
        for model, cases in SECTIONS.items()
        for index, case in enumerate(cases)
    ]


@pytest.mark.parametrize("case", _cases())
def test_a_section_gets_the_same_verdict_in_process_and_from_the_api(api: API, case: Case) -> None:
    section = case.section
    if case.field == "distillation":
        section = {**section, "teacher_model_id": api.model_id}
    data = {**case.others, case.field: section}
    verdict, config = _in_process(data)
    assert verdict.accepted is not case.refused, verdict
    if config is None:
        assert _api_verdict(_post_job(api, data), "config") == verdict
        return
    as_sent = config.model_dump(mode="json", exclude_unset=True)
    every_default = config.model_dump(mode="json")
    for body in (as_sent, every_default):
        assert _api_verdict(_post_job(api, body), "config") == verdict, body


@pytest.mark.parametrize("search", SEARCHES)
def test_a_search_config_gets_the_same_verdict_in_process_and_from_the_api(
    api: API, search: dict[str, Any]
) -> None:
    try:
        config = HPConfig(**search)
    except pydantic.ValidationError as exc:  # pragma: no cover - the table holds valid ones
        pytest.fail(str(exc))
    problems, invalid = search_space_problems(config)
    refused = {f"search_space.{name}" for name in invalid} | {p.field for p in problems}
    expected = Verdict(not refused, frozenset(f.split(".")[0] for f in refused))
    body = {"model_id": api.model_id, "dataset_id": api.dataset_id,
            "config": config.model_dump(mode="json")}  # fmt: skip
    assert _api_verdict(api.http.post("/v1/searches", json=body), "config") == expected


def test_the_simplest_quantization_job_is_accepted_through_the_client(api: API) -> None:
    """Issue 26: ``ace3.QuantizationConfig(precision="int8")`` submitted with ace3.Client."""
    config = ace3.TrainingConfig(quantization=ace3.QuantizationConfig(precision="int8"))
    with ace3.Client(api_key=api.key, base_url=api.base_url) as client:
        job = client.jobs.create(model_id=api.model_id, dataset_id=api.dataset_id, config=config)
    assert job.state == ace3.JobState.QUEUED
    assert job.config["quantization"] == {
        "precision": "int8",
        "method": "dynamic",
        "calibration_steps": None,
        "target_modules": None,
    }
    # Every default filled in (what the client sent before) means the same config.
    assert _post_job(api, config.model_dump(mode="json")).status_code == 201
