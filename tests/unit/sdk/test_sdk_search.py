"""Hyperparameter search in the SDK: search spaces and HPConfig, ace3.utils.grid_search,
refusals before any request, client.searches, and ace3.hyperparameter_search end to end over
the fake API (including the document's two snippets)."""

from __future__ import annotations

import hashlib
import io
import json
import math
from pathlib import Path

import httpx
import pytest

import ace3
from ace3.client import DatasetRef, ModelRef
from ace3.client.searches import SearchEvent
from ace3.follow.search_display import PlainSearchDisplay, RichSearchDisplay, create_search_display
from tests.unit.sdk.sdk_fakes import (
    DroppingStream,
    MockAPI,
    dataset_json,
    job_json,
    metric,
    model_json,
    search_json,
    sse_body,
    sse_response,
    trial_json,
)


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def refs(api: MockAPI) -> tuple[ModelRef, DatasetRef]:
    client = api.client()
    model = ModelRef(ace3.Model.model_validate(model_json()), client)
    dataset = DatasetRef(ace3.Dataset.model_validate(dataset_json()), client)
    return model, dataset


# -- search spaces and HPConfig -------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ace3.hp.choice([]), "at least one option"),
        (lambda: ace3.hp.choice([1, 1]), "distinct"),
        (lambda: ace3.hp.uniform(1.0, 1.0), "smaller than high"),
        (lambda: ace3.hp.uniform(2.0, 1.0), "smaller than high"),
        (lambda: ace3.hp.uniform(0.0, math.inf), "finite"),
        (lambda: ace3.hp.loguniform(0.0, 1.0), "positive bounds"),
        (lambda: ace3.hp.loguniform(-1.0, 1.0), "positive bounds"),
        (lambda: ace3.hp.qloguniform(0, 64, 8), "positive bounds"),
        (lambda: ace3.hp.quniform(0.0, 1.0, 0.3), "multiple of q"),
        (lambda: ace3.hp.quniform(0.0, 1.0, 0.0), "q must be positive"),
        (lambda: ace3.hp.randint(0, 10, 3), "multiple of step"),
        (lambda: ace3.hp.randint(5, 5), "smaller than high"),
    ],
)
def test_bad_dimensions_fail_when_written(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ace3.hp.quniform(0.0, 1.0, 5e-324), r"step q \(5e-324\) is too small"),
        (lambda: ace3.hp.quniform(0.0, 1.0, math.inf), "step q must be a finite number"),
        (lambda: ace3.hp.quniform(0.0, 1.0, math.nan), "step q must be a finite number"),
        (lambda: ace3.hp.qloguniform(1, 10**400), "finite numbers"),
        (lambda: ace3.hp.qloguniform(1, 2**70, 10**400), "step q must be a finite number"),
        (lambda: ace3.hp.randint(0, 10**400), "finite numbers"),
    ],
)
def test_steps_and_bounds_beyond_float_range_are_value_errors_naming_the_field(make, message):
    """Never an OverflowError (which the service would answer with a 500)."""
    with pytest.raises(ValueError, match=message):
        make()


def test_search_space_keys_are_training_fields_or_model_kwargs():
    with pytest.raises(ValueError, match=r"'hidden' is not a TrainingConfig field.*model\.hidden"):
        ace3.HPConfig(search_space={"hidden": ace3.hp.randint(32, 256)})
    with pytest.raises(ValueError, match="Python identifier"):
        ace3.HPConfig(search_space={"model.2x": ace3.hp.randint(32, 256)})
    with pytest.raises(ValueError, match="search space is empty"):
        ace3.HPConfig(search_space={})
    config = ace3.HPConfig(
        search_space={"model.hidden": ace3.hp.randint(32, 256), "dropout": ace3.hp.uniform(0, 0.5)}
    )
    assert set(config.search_space) == {"model.hidden", "dropout"}
    assert ace3.hp.split_params({"model.hidden": 64, "dropout": 0.1}) == (
        {"dropout": 0.1},
        {"hidden": 64},
    )


def test_grid_refuses_continuous_dimensions_and_counts_its_combinations():
    with pytest.raises(ValueError, match="learning_rate: a loguniform dimension is continuous"):
        ace3.HPConfig(
            search_space={"learning_rate": ace3.hp.loguniform(1e-4, 1e-2)}, algorithm="grid"
        )
    grid = ace3.HPConfig(
        search_space={
            "batch_size": ace3.hp.choice([32, 64, 128]),
            "epochs": ace3.hp.randint(1, 5, 2),  # 1, 3, 5
            "weight_decay": ace3.hp.quniform(0.0, 0.1, 0.05),  # 0, 0.05, 0.1
            "model.hidden": ace3.hp.qloguniform(32, 128, 32),  # 32, 64, 96, 128
        },
        algorithm="grid",
    )
    assert grid.grid_size == 3 * 3 * 3 * 4
    assert grid.trial_budget == 108  # the whole grid by default
    assert grid.model_copy(update={"max_trials": 10}).trial_budget == 10
    assert ace3.HPConfig(search_space=grid.search_space, max_trials=500).trial_budget == 500
    bayesian = ace3.HPConfig(search_space={"dropout": ace3.hp.uniform(0.1, 0.5)})
    assert bayesian.trial_budget == 20 and bayesian.failure_budget == 5
    assert bayesian.algorithm == "bayesian" and bayesian.direction == "maximize"


def test_hp_config_serialises_to_the_api_json():
    config = ace3.HPConfig(
        search_space={
            "learning_rate": ace3.hp.loguniform(1e-5, 1e-2),
            "batch_size": ace3.hp.choice([16, 32]),
            "weight_decay": ace3.hp.uniform(0.0, 0.1),
            "momentum": ace3.hp.quniform(0.5, 0.9, 0.2),
            "model.layers": ace3.hp.qloguniform(1, 8),
            "epochs": ace3.hp.randint(1, 3),
        },
        algorithm="random",
        max_trials=8,
        objective="val_loss",
        direction="minimize",
        pruner="median",
        base_config=ace3.TrainingConfig(epochs=2),
    )
    payload = json.loads(json.dumps(config.model_dump(mode="json")))
    assert payload["search_space"] == {
        "learning_rate": {"type": "loguniform", "low": 1e-5, "high": 1e-2},
        "batch_size": {"type": "choice", "options": [16, 32]},
        "weight_decay": {"type": "uniform", "low": 0.0, "high": 0.1},
        "momentum": {"type": "quniform", "low": 0.5, "high": 0.9, "q": 0.2},
        "model.layers": {"type": "qloguniform", "low": 1, "high": 8, "q": 1},
        "epochs": {"type": "randint", "low": 1, "high": 3, "step": 1},
    }
    assert {key: payload[key] for key in ("algorithm", "max_trials", "objective", "pruner")} == {
        "algorithm": "random",
        "max_trials": 8,
        "objective": "val_loss",
        "pruner": "median",
    }
    assert payload["direction"] == "minimize" and payload["base_config"]["epochs"] == 2
    assert ace3.HPConfig.model_validate(payload) == config  # and back


def test_grid_search_yields_every_combination_as_dicts():
    assert ace3.utils.grid_search is ace3.hp.grid_search
    combos = list(ace3.utils.grid_search({"learning_rate": [1e-4, 1e-3], "batch_size": [32, 64]}))
    assert combos == [
        {"learning_rate": 1e-4, "batch_size": 32},
        {"learning_rate": 1e-4, "batch_size": 64},
        {"learning_rate": 1e-3, "batch_size": 32},
        {"learning_rate": 1e-3, "batch_size": 64},
    ]
    with pytest.raises(ValueError, match=r"param_grid\['batch_size'\] is empty"):
        list(ace3.utils.grid_search({"learning_rate": [1e-4], "batch_size": []}))
    with pytest.raises(ValueError, match="non-empty dict"):
        list(ace3.utils.grid_search({}))
    with pytest.raises(ValueError, match="list of values"):
        list(ace3.utils.grid_search({"optimizer": "adamw"}))


def test_the_search_names_are_exported():
    for name in ("hp", "utils", "HPConfig", "hyperparameter_search"):
        assert name in ace3.__all__
        assert getattr(ace3, name) is not None


# -- refusals before any request ------------------------------------------------------------

SPACE = {"learning_rate": ace3.hp.loguniform(1e-5, 1e-2)}


def test_unsupported_base_config_is_refused_before_any_request(api, refs):
    model, dataset = refs
    config = ace3.HPConfig(
        search_space=SPACE,
        base_config=ace3.TrainingConfig(num_stages=2, zero_stage=2, optimizer="adam8bit"),
    )
    with pytest.raises(ace3.UnsupportedFeatureError) as caught:
        ace3.hyperparameter_search(model, dataset, config)
    assert {problem.field for problem in caught.value.problems} == {
        "num_stages",
        "optimizer",
    }
    assert "only used with parallelism='model' or 'pipeline'" in str(caught.value)
    assert api.requests == []


def test_unsupported_or_invalid_searched_values_are_refused_before_any_request(api, refs):
    model, dataset = refs
    unsupported = ace3.HPConfig(
        search_space={"num_nodes": ace3.hp.choice([1, 2, 4])},
        base_config=ace3.TrainingConfig(zero_stage=3, batch_size=64, async_save=True),
    )
    with pytest.raises(
        ace3.UnsupportedFeatureError, match="search_space: async_save with num_nodes=2"
    ) as c:
        ace3.hyperparameter_search(model, dataset, unsupported)
    assert [p.field for p in c.value.problems] == ["search_space.num_nodes"] * 2
    for space, message in [
        ({"learning_rate": ace3.hp.uniform(0.0, 0.1)}, "learning_rate: 0.0 .*greater than 0"),
        ({"epochs": ace3.hp.uniform(1, 10)}, "epochs: uniform draws floats.*randint"),
        ({"optimizer": ace3.hp.choice(["adamw", "rmsprop"])}, "'rmsprop'"),
    ]:
        with pytest.raises(ValueError, match=message):
            ace3.hyperparameter_search(model, dataset, ace3.HPConfig(search_space=space))
    assert api.requests == []


def test_config_must_be_an_hp_config(api, refs):
    model, dataset = refs
    with pytest.raises(TypeError, match="config is required"):
        ace3.hyperparameter_search(model, dataset)
    with pytest.raises(TypeError, match=r"must be an ace3\.HPConfig, not TrainingConfig"):
        ace3.hyperparameter_search(model, dataset, ace3.TrainingConfig())
    with pytest.raises(ValueError, match="dataset is required"):
        ace3.hyperparameter_search(model, None, ace3.HPConfig(search_space=SPACE))
    assert api.requests == []


# -- a search over the fake API -------------------------------------------------------------

PARAMS = [
    {"learning_rate": 1e-3, "batch_size": 32, "weight_decay": 0.05, "dropout": 0.2},
    {"learning_rate": 1e-2, "batch_size": 128, "weight_decay": 0.01, "dropout": 0.4},
    {"learning_rate": 4e-4, "batch_size": 64, "weight_decay": 0.02, "dropout": 0.1},
]
FINAL_TRIALS = [
    trial_json(
        0,
        "succeeded",
        params=PARAMS[0],
        value=0.90,
        epochs_run=2,
        checkpoint_id="ck_t0",
        intermediate_values={"1": 0.80, "2": 0.90},
    ),
    trial_json(
        1, "pruned", params=PARAMS[1], value=0.5, epochs_run=1, intermediate_values={"1": 0.5}
    ),
    trial_json(
        2,
        "succeeded",
        params=PARAMS[2],
        value=0.95,
        epochs_run=2,
        checkpoint_id="ck_t2",
        intermediate_values={"1": 0.88, "2": 0.95},
    ),
]
COUNTS = {"trials_created": 3, "trials_succeeded": 2, "trials_pruned": 1, "epochs_run": 5}
BEST_CHECKPOINT = {
    "id": "ck_t2",
    "name": "step-00000040.pt",
    "step": 40,
    "epoch": 2,
    "attempt": 1,
    "sha256": hashlib.sha256(b"best weights").hexdigest(),
    "size_bytes": 12,
    "metrics": {"val_accuracy": 0.95},
    "created_at": "2025-01-01T00:00:00Z",
}


def search_events(end_state: str = "succeeded", **end_fields) -> list[tuple[str, object, str]]:
    t0, t1, t2 = FINAL_TRIALS
    events: list[tuple[str, object]] = [
        ("state", search_json("queued")),
        ("state", search_json("running")),
        ("trial", trial_json(0, params=PARAMS[0])),
        ("trial", trial_json(1, params=PARAMS[1])),
        ("trial", {**trial_json(0, params=PARAMS[0]), "intermediate_values": {"1": 0.8}}),
        ("trial", {**trial_json(1, params=PARAMS[1]), "intermediate_values": {"1": 0.5}}),
        ("trial", t1),
        ("trial", t0),
        ("trial", trial_json(2, params=PARAMS[2])),
        ("trial", t2),
    ]
    best = t2 if end_state != "failed" else None
    final = search_json(end_state, best_trial=best, **COUNTS, **end_fields)
    events += [("state", final), ("end", final)]
    return [(kind, data, str(number)) for number, (kind, data) in enumerate(events, start=1)]


def serve_search(
    api: MockAPI, end_state: str = "succeeded", trials: list | None = None, **end_fields
) -> None:
    """Routes for one search (routes added before these ones win)."""
    api.route("POST", "/v1/searches", httpx.Response(201, json=search_json()))
    api.route(
        "GET", "/v1/searches/srch_1/events", sse_response(search_events(end_state, **end_fields))
    )
    trials = FINAL_TRIALS if trials is None else trials
    api.route("GET", "/v1/searches/srch_1/trials", httpx.Response(200, json={"data": trials}))
    checkpoints = [{**BEST_CHECKPOINT, "id": "ck_early", "step": 20}, BEST_CHECKPOINT]
    api.route("GET", "/v1/jobs/job_t2/checkpoints", httpx.Response(200, json={"data": checkpoints}))


def doc_config() -> ace3.HPConfig:
    return ace3.HPConfig(
        search_space={
            "learning_rate": ace3.hp.loguniform(1e-5, 1e-2),
            "batch_size": ace3.hp.choice([16, 32, 64, 128]),
            "weight_decay": ace3.hp.uniform(0.0, 0.1),
            "dropout": ace3.hp.uniform(0.1, 0.5),
        },
        max_trials=3,
    )


def test_hyperparameter_search_returns_the_best_params_with_the_full_result(api, refs, capsys):
    model, dataset = refs
    serve_search(api)
    best = ace3.hyperparameter_search(
        model, dataset, doc_config(), validation_dataset=dataset, model_kwargs={"hidden": 64}
    )
    assert isinstance(best, dict) and isinstance(best, ace3.BestParams)
    assert best == PARAMS[2] and best.search_id == "srch_1" and best.value == 0.95
    result = best.result
    assert isinstance(result, ace3.SearchResult)
    assert [(t.number, t.state) for t in result.trials] == [
        (0, "succeeded"),
        (1, "pruned"),
        (2, "succeeded"),
    ]
    assert result.best_trial.number == 2 and result.best_params == PARAMS[2]
    assert result.best_value == 0.95 and result.best_job_id == "job_t2"
    assert result.best_checkpoint.id == "ck_t2" and result.best_checkpoint.step == 40
    assert result.epochs_run == 5 and result.search.state == ace3.SearchState.SUCCEEDED
    assert result.best_config().learning_rate == 4e-4 and result.best_config().dropout == 0.1

    create = next(r for r in api.requests if r.url.path == "/v1/searches")
    body = json.loads(create.content)
    assert body["model_id"] == "mdl_1" and body["validation_dataset_id"] == "ds_1"
    assert body["model_kwargs"] == {"hidden": 64}
    assert body["config"] == json.loads(json.dumps(doc_config().model_dump(mode="json")))
    assert body["config"]["search_space"]["batch_size"]["type"] == "choice"
    assert create.headers["idempotency-key"]

    lines = capsys.readouterr().out.splitlines()  # not a terminal: plain lines
    assert lines[:3] == [
        "search srch_1: queued",
        "search srch_1: running",
        "trial 0 started (job job_t0): learning_rate=0.001 batch_size=32 weight_decay=0.05 "
        "dropout=0.2",
    ]
    assert "trial 0 epoch 1: val_accuracy=0.8" in lines
    assert "trial 1 pruned: val_accuracy=0.5 after 1 epoch" in lines
    assert "trial 0 succeeded: val_accuracy=0.9 after 2 epochs (best so far)" in lines
    assert "trial 2 succeeded: val_accuracy=0.95 after 2 epochs (best so far)" in lines
    assert lines[-1].startswith("search srch_1 succeeded after 0s: 3/3 trials (2 succeeded, 1")
    assert lines[-1].endswith(
        "| best trial 2: val_accuracy=0.95 learning_rate=0.0004 "
        "batch_size=64 weight_decay=0.02 dropout=0.1"
    )


def test_download_best_checkpoint(api, refs, tmp_path: Path):
    model, dataset = refs
    serve_search(api)
    api.route(
        "GET",
        "/v1/jobs/job_t2/checkpoints/ck_t2/content",
        httpx.Response(
            200,
            content=b"best weights",
            headers={"x-checksum-sha256": BEST_CHECKPOINT["sha256"]},
        ),
    )
    best = ace3.hyperparameter_search(model, dataset, doc_config(), show_progress=False)
    path = best.result.download_best_checkpoint(tmp_path)
    assert path == tmp_path / "step-00000040.pt" and path.read_bytes() == b"best weights"


def test_a_failed_search_raises_search_failed_error(api, refs):
    model, dataset = refs
    failed = [
        trial_json(n, "failed", error=f"CUDA out of memory in trial {n}", job_id=f"job_t{n}")
        for n in range(3)
    ]
    serve_search(api, "failed", trials=failed, error="3 trials failed (max_failed_trials=3)")
    with pytest.raises(ace3.SearchFailedError) as caught:
        ace3.hyperparameter_search(model, dataset, doc_config(), show_progress=False)
    error = caught.value
    assert isinstance(error, ace3.ACE3Error)
    assert error.search.state == "failed" and len(error.trials) == 3
    assert error.best_params is None
    assert "search srch_1 failed: 3 trials failed" in str(error)
    assert "trial 1 (job job_t1): CUDA out of memory in trial 1" in str(error)


def test_a_cancelled_search_raises_with_its_best_trial_so_far(api, refs):
    model, dataset = refs
    serve_search(api, "cancelled")
    with pytest.raises(ace3.SearchCancelledError, match="srch_1 was cancelled; best trial so far"):
        ace3.hyperparameter_search(model, dataset, doc_config(), show_progress=False)
    try:
        ace3.hyperparameter_search(model, dataset, doc_config(), show_progress=False)
    except ace3.SearchCancelledError as error:
        assert error.best_params == PARAMS[2]


def test_wait_false_returns_a_search_handle(api, refs):
    model, dataset = refs
    serve_search(api)
    handle = ace3.hyperparameter_search(
        model, dataset, doc_config(), wait=False, idempotency_key="my-key", name="sweep"
    )
    assert isinstance(handle, ace3.SearchHandle) and handle.id == "srch_1"
    assert api.requests[-1].headers["idempotency-key"] == "my-key"
    assert json.loads(api.requests[-1].content)["name"] == "sweep"
    assert "/v1/searches/srch_1/events" not in api.paths()
    result = handle.wait()
    assert result.best_params == PARAMS[2] and handle.state == "succeeded"


def test_a_dropped_stream_resumes_and_repeats_nothing(api, refs, capsys):
    model, dataset = refs
    events = search_events()
    dropped = httpx.Response(
        200,
        stream=DroppingStream([sse_body(events[:5])]),
        headers={"content-type": "text/event-stream"},
    )
    # on reconnect the server sends the current state and every trial as it is now, then goes on
    resent = [events[1], events[4], events[3], *events[5:]]
    api.route("GET", "/v1/searches/srch_1/events", dropped, sse_response(resent))
    serve_search(api)
    best = ace3.hyperparameter_search(model, dataset, doc_config())
    assert best == PARAMS[2]
    streams = [r for r in api.requests if r.url.path == "/v1/searches/srch_1/events"]
    assert len(streams) == 2 and streams[1].headers["last-event-id"] == "5"
    out = capsys.readouterr().out
    assert out.count("trial 0 started") == 1 and out.count("trial 0 epoch 1:") == 1
    assert out.count("search srch_1: running") == 1


def test_ctrl_c_cancels_the_search(api, refs, capsys):
    model, dataset = refs

    def interrupt(request):
        raise KeyboardInterrupt

    api.route("POST", "/v1/searches", httpx.Response(201, json=search_json()))
    api.route("GET", "/v1/searches/srch_1/events", interrupt)
    api.route(
        "POST",
        "/v1/searches/srch_1/cancel",
        httpx.Response(202, json=search_json("cancelling", cancel_requested=True)),
    )
    with pytest.raises(KeyboardInterrupt):
        ace3.hyperparameter_search(model, dataset, doc_config())
    assert "/v1/searches/srch_1/cancel" in api.paths("POST")
    assert "cancelled search srch_1" in capsys.readouterr().out


def test_searches_resource(api: MockAPI):
    page_two = {"data": [search_json("failed", id="srch_0")], "next_cursor": None}
    api.route(
        "GET",
        "/v1/searches",
        httpx.Response(200, json={"data": [search_json("running")], "next_cursor": "c1"}),
        httpx.Response(200, json=page_two),
    )
    api.route(
        "GET",
        "/v1/searches/srch_1",
        httpx.Response(200, json=search_json("running", new_field=1, best_trial=FINAL_TRIALS[0])),
    )
    shuffled = [FINAL_TRIALS[2], {**FINAL_TRIALS[0], "state": "waiting"}, FINAL_TRIALS[1]]
    api.route("GET", "/v1/searches/srch_1/trials", httpx.Response(200, json={"data": shuffled}))
    client = api.client()
    assert [s.id for s in client.searches.list(state=ace3.SearchState.RUNNING, limit=1)] == [
        "srch_1",
        "srch_0",
    ]
    assert api.requests[0].url.params["state"] == "running"
    assert api.requests[1].url.params["cursor"] == "c1"
    search = client.searches.retrieve("srch_1")
    assert search.new_field == 1 and search.best_trial.value == 0.9  # unknown fields kept
    assert not search.is_terminal and search.objective == "val_accuracy"
    trials = client.searches.trials("srch_1")
    assert [t.number for t in trials] == [0, 1, 2]
    assert trials[0].state == "waiting" and not trials[0].is_finished  # unknown state kept
    assert trials[2].intermediate() == [(1, 0.88), (2, 0.95)] and trials[1].latest_value == 0.5
    handle = client.search("srch_1")
    with pytest.raises(RuntimeError, match="has not finished: it is running"):
        handle.result()


def test_a_finished_search_result_from_its_id(api: MockAPI):
    final = search_json("succeeded", best_trial=FINAL_TRIALS[2], **COUNTS)
    api.route("GET", "/v1/searches/srch_1", httpx.Response(200, json=final))
    api.route("GET", "/v1/searches/srch_1/trials", httpx.Response(200, json={"data": FINAL_TRIALS}))
    api.route("GET", "/v1/jobs/job_t2/checkpoints", httpx.Response(200, json={"data": []}))
    result = api.client().search("srch_1").result()
    assert result.best_params == PARAMS[2] and len(result.trials) == 3
    assert result.best_checkpoint is None  # not listed (yet): download falls back to the id
    assert "best_value=0.95" in repr(result)


# -- the live table -------------------------------------------------------------------------


def display_events() -> list[SearchEvent]:
    typed = {"trial": ace3.SearchTrial, "state": ace3.Search, "end": ace3.Search}
    return [
        SearchEvent(kind, typed[kind].model_validate(data), event_id)
        for kind, data, event_id in search_events()
    ]


def test_a_terminal_gets_a_live_table_of_the_trials(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out = FakeTerminal()
    display = create_search_display(None, mode="auto", file=out)
    assert isinstance(display, RichSearchDisplay)
    with display:
        for event in display_events():
            display.handle(event)
    text = out.getvalue()
    assert "learning_rate=0.0004 batch_size=64" in text
    assert "pruned" in text and "2*" in text  # the best trial is starred
    assert "best trial 2: val_accuracy=0.95" in text
    assert "search srch_1 succeeded after 0s" in text
    assert isinstance(
        create_search_display(None, mode="auto", file=io.StringIO()), PlainSearchDisplay
    )


def test_best_so_far_does_not_depend_on_the_order_of_state_and_trial_events():
    out = io.StringIO()
    t1 = trial_json(1, "succeeded", value=0.9, epochs_run=1)
    t0 = trial_json(0, "succeeded", value=0.9, epochs_run=1)  # a tie goes to the lower number
    events = [
        ("trial", trial_json(0)),
        ("trial", trial_json(1)),
        ("state", search_json("running", best_trial=t1)),  # the server's state comes first
        ("trial", t1),
        ("trial", t0),
    ]
    with create_search_display(None, mode="plain", file=out) as display:
        for kind, data in events:
            model = ace3.SearchTrial if kind == "trial" else ace3.Search
            display.handle(SearchEvent(kind, model.model_validate(data)))
    lines = out.getvalue().splitlines()
    assert "trial 1 succeeded: val_accuracy=0.9 after 1 epoch (best so far)" in lines
    assert "trial 0 succeeded: val_accuracy=0.9 after 1 epoch (best so far)" in lines


def test_the_live_table_keeps_the_running_and_best_trials_when_there_are_many():
    display = RichSearchDisplay(ace3.Search.model_validate(search_json("running")), FakeTerminal())
    try:
        for number in range(30):
            state, value = ("succeeded", 0.5 + number / 100) if number < 25 else ("running", None)
            trial = trial_json(number, state, value=value)
            if number == 3:
                trial["value"] = 0.99
            display.handle(SearchEvent("trial", ace3.SearchTrial.model_validate(trial)))
        shown, hidden = display.rows()
    finally:
        display.close()
    numbers = [trial.number for trial in shown]
    assert len(numbers) == 12 and hidden == 18
    assert 3 in numbers and {25, 26, 27, 28, 29} <= set(numbers)


# -- the document's snippets ----------------------------------------------------------------

AUTOMATIC_SNIPPET = """
# Define search space
search_space = {
    "learning_rate": ace3.hp.loguniform(1e-5, 1e-2),
    "batch_size": ace3.hp.choice([16, 32, 64, 128]),
    "weight_decay": ace3.hp.uniform(0.0, 0.1),
    "dropout": ace3.hp.uniform(0.1, 0.5)
}

# Configure hyperparameter search
hp_config = ace3.HPConfig(
    search_space=search_space,
    algorithm="bayesian",  # or "random", "grid"
    max_trials=50,
    objective="val_accuracy",
    direction="maximize"
)

# Run hyperparameter optimization
best_params = ace3.hyperparameter_search(
    model=model,
    dataset=dataset,
    config=hp_config
)

print(f"Best parameters: {best_params}")
"""

MANUAL_SNIPPET = """
# Grid search
param_grid = {
    "learning_rate": [1e-4, 5e-4, 1e-3],
    "batch_size": [32, 64, 128],
    "weight_decay": [0.01, 0.05, 0.1]
}

best_score = 0
best_params = None

for params in ace3.utils.grid_search(param_grid):
    config = ace3.TrainingConfig(**params)
    trainer = ace3.Trainer(config)
    
    results = trainer.train(model, dataset)
    score = results.best_val_accuracy
    
    if score > best_score:
        best_score = score
        best_params = params

print(f"Best parameters: {best_params}")
print(f"Best score: {best_score}")
"""  # noqa: W293 - verbatim, trailing spaces included


def test_the_documents_automatic_snippet(api, refs, capsys):
    model, dataset = refs
    serve_search(api)
    namespace = {"ace3": ace3, "model": model, "dataset": dataset}
    exec(AUTOMATIC_SNIPPET, namespace)
    assert f"Best parameters: {PARAMS[2]}" in capsys.readouterr().out
    sent = json.loads(next(r for r in api.requests if r.url.path == "/v1/searches").content)
    assert sent["config"]["max_trials"] == 50 and sent["config"]["algorithm"] == "bayesian"
    assert namespace["best_params"].result.best_checkpoint.id == "ck_t2"


def test_the_documents_manual_grid_snippet(api, refs, capsys):
    model, dataset = refs
    submitted: list[dict] = []

    def score(config: dict) -> float:  # peaks at learning_rate=5e-4, batch 64, decay 0.05
        return round(
            0.9
            - abs(math.log10(config["learning_rate"] / 5e-4)) / 10
            - abs(config["batch_size"] - 64) / 1000
            - abs(config["weight_decay"] - 0.05),
            6,
        )

    def create(request: httpx.Request) -> httpx.Response:
        submitted.append(json.loads(request.content)["config"])
        return httpx.Response(201, json=job_json(config=submitted[-1]))

    def events(request: httpx.Request) -> httpx.Response:
        final = {"val_accuracy": score(submitted[-1])}
        done = job_json(state="succeeded", config=submitted[-1], final_metrics=final)
        return sse_response([("state", job_json(state="running"), "0:0"), ("end", done, "0:0")])

    def metrics(request: httpx.Request) -> httpx.Response:
        value = score(submitted[-1])
        return httpx.Response(200, json={"data": [metric(10, "val_accuracy", value, epoch=1)]})

    api.route("POST", "/v1/jobs", create)
    api.route("GET", "/v1/jobs/job_1/events", events)
    api.route("GET", "/v1/jobs/job_1/metrics", metrics)
    api.route("GET", "/v1/jobs/job_1/checkpoints", httpx.Response(200, json={"data": []}))
    exec(MANUAL_SNIPPET, {"ace3": ace3, "model": model, "dataset": dataset})
    assert len(submitted) == 27
    assert {(c["learning_rate"], c["batch_size"], c["weight_decay"]) for c in submitted} == {
        (lr, bs, wd)
        for lr in (1e-4, 5e-4, 1e-3)
        for bs in (32, 64, 128)
        for wd in (0.01, 0.05, 0.1)
    }
    out = capsys.readouterr().out
    best = {"learning_rate": 5e-4, "batch_size": 64, "weight_decay": 0.05}
    assert f"Best parameters: {best}" in out
    assert "Best score: 0.9" in out
