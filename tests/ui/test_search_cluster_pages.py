"""The dashboard's Searches, Search and Cluster pages in a real browser on the real stack: a tiny
search's page fills its trials table and plots as its trials finish, a search is cancelled from
its page, and the cluster page lists the stack's worker."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete

import ace3
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, utcnow
from tests.conftest import DigitsFiles, Stack
from tests.ui.conftest import sign_in

SPACE = {
    "learning_rate": ace3.hp.loguniform(1e-3, 1e-2),
    "model.hidden": ace3.hp.choice([16, 32]),
}


@pytest.fixture(scope="module")
def ui_key(stack: Stack) -> tuple[str, str]:
    """An owner of this module's own: the trial jobs of its searches never show up in the other
    dashboard tests' job lists."""
    return stack.create_key("ui-searches")


@pytest.fixture(scope="module")
def ui_client(stack: Stack, ui_key: tuple[str, str]) -> Iterator[ace3.Client]:
    with ace3.Client(api_key=ui_key[0], base_url=stack.base_url) as client:
        yield client


@pytest.fixture(scope="module")
def uploaded(ui_client: ace3.Client, digits_files: DigitsFiles) -> dict[str, str]:
    return {
        "model_id": ui_client.load_model(digits_files.model).id,
        "dataset_id": ui_client.load_dataset(digits_files.train).id,
        "validation_dataset_id": ui_client.load_dataset(digits_files.validation).id,
    }


def _search(
    ui_client: ace3.Client, uploaded: dict[str, str], name: str, epochs: int = 1, **config: Any
) -> Any:
    hp = ace3.HPConfig(
        search_space=SPACE,
        algorithm="random",
        seed=3,
        base_config=ace3.TrainingConfig(epochs=epochs, batch_size=64),
        **config,
    )
    return ui_client.searches.create(name=name, config=hp, **uploaded)


def test_a_search_page_shows_trials_best_so_far_and_parameter_plots(
    page: Any, stack: Stack, ui_key: tuple[str, str], ui_client: ace3.Client,
    uploaded: dict[str, str], tmp_path: Path,
) -> None:  # fmt: skip
    search = _search(ui_client, uploaded, "ui-search", max_trials=2, parallel_trials=2)
    sign_in(page, stack, ui_key[0], "#/searches")
    row = page.locator(f"tr[data-search-id='{search.id}']")
    row.wait_for()
    assert "ui-search" in row.inner_text()
    row.locator("a").click()
    page.wait_for_url(f"**#/searches/{search.id}")
    page.locator("#trials tr[data-trial='0']").wait_for()
    assert page.locator("#cancel-search").is_visible()
    # The page polls: it shows the search finished, both trials, and the plots, unreloaded.
    page.wait_for_selector(".page-search[data-state='succeeded']", timeout=90_000)
    trials = page.locator("#trials tbody tr")
    assert trials.count() == 2
    assert page.locator("#trials tr.best-trial").count() == 1
    headers = page.locator("#trials thead th").all_inner_texts()
    assert {"learning_rate", "model.hidden", search.objective} <= set(headers)
    text = page.locator("#trials").inner_text()
    assert text.count("succeeded") == 2
    job_link = page.locator("#trials tbody tr a[href^='#/jobs/']").first
    assert job_link.get_attribute("href") in {
        f"#/jobs/{t.job_id}" for t in ui_client.searches.trials(search.id)
    }
    assert page.locator("#best-so-far").get_attribute("data-points") == "2"
    assert page.locator("#best-so-far canvas").count() == 1
    assert page.locator("#trial-curves").get_attribute("data-points") == "2"  # 1 epoch each
    for name in SPACE:
        chart = page.locator(f"#param-charts [data-param='{name}']")
        assert chart.get_attribute("data-points") == "2", name
        assert chart.locator("canvas").count() == 1
    assert not page.locator("#cancel-search").is_visible()
    page.screenshot(path=str(tmp_path / "search.png"), full_page=True)

    page.click("nav a[data-nav='searches']")
    page.locator(f"tr[data-search-id='{search.id}'] .state-succeeded").wait_for()
    page.screenshot(path=str(tmp_path / "searches.png"), full_page=True)
    assert page.page_errors == []


def test_cancel_a_search_from_its_page_and_no_page_for_others_searches(
    page: Any, stack: Stack, ui_key: tuple[str, str], ui_client: ace3.Client,
    uploaded: dict[str, str], tmp_path: Path,
) -> None:  # fmt: skip
    # (trials that run until cancelled: a trial of one epoch ends before the page is read)
    search = _search(
        ui_client, uploaded, "ui-cancel", epochs=1000, max_trials=20, parallel_trials=1
    )
    sign_in(page, stack, ui_key[0], f"#/searches/{search.id}")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-search")
    page.wait_for_selector(".page-search[data-state='cancelled']", timeout=30_000)
    assert ui_client.searches.retrieve(search.id).state == "cancelled"
    assert not page.locator("#cancel-search").is_visible()
    assert page.locator("#best-so-far.is-empty").count() == 1  # nothing finished: it says so
    page.screenshot(path=str(tmp_path / "cancelled.png"), full_page=True)

    # Another owner's key: the page has nothing to show of it.
    page.click("#sign-out")
    sign_in(page, stack, stack.create_key("ui-other")[0], f"#/searches/{search.id}")
    page.wait_for_selector("text=Search not found")
    assert "ui-cancel" not in page.content()
    assert page.page_errors == []


def test_the_cluster_page_lists_the_worker_and_the_queue(
    page: Any, stack: Stack, ui_key: tuple[str, str], ui_client: ace3.Client,
    uploaded: dict[str, str], database_url: str, tmp_path: Path,
) -> None:  # fmt: skip
    [worker] = [w for w in ui_client.workers.list() if w.queue == stack.env["ACE3_QUEUE_NAME"]]
    # A queued job of the page's owner that no worker claims (larger than the stack's worker)
    # nor is told about (published "in an hour": the reconciler leaves it alone), so it waits,
    # last in line (low priority, queued "in an hour"), while the page shows it.
    engine = make_sync_engine(database_url)
    sessions = sync_session_factory(engine)
    later = utcnow() + timedelta(hours=1)
    with sessions() as session:
        job = Job(owner_id=ui_key[1], name="ui-waiting", config={"num_gpus": 64}, model_kwargs={},
                  num_processes=64, priority="low", request_hash="h", enqueued_at=later,
                  queued_at=later, model_id=uploaded["model_id"],
                  dataset_id=uploaded["dataset_id"])  # fmt: skip
        session.add(job)
        session.commit()
        job_id = job.id
    try:
        sign_in(page, stack, ui_key[0], "#/cluster")
        row = page.locator(f"#workers tr[data-worker='{worker.id}']")
        row.wait_for()
        assert worker.hostname in row.inner_text() and "8 \u00d7 CPU process" in row.inner_text()
        assert page.locator("#card-slots .value").inner_text() == str(worker.slots)
        queued = page.locator(f"#queue tr[data-queued-job='{job_id}']")
        queued.wait_for()
        position = int(page.locator("#card-queued .value").inner_text())
        assert "ui-waiting" in queued.inner_text() and f"#{position}" in queued.inner_text()
        assert "low" in queued.inner_text()
        assert queued.locator("a").get_attribute("href") == f"#/jobs/{job_id}"
        page.screenshot(path=str(tmp_path / "cluster.png"), full_page=True)
        assert page.page_errors == []
    finally:
        with sessions() as session:
            session.execute(delete(Job).where(Job.id == job_id))
            session.commit()
        engine.dispose()


def test_best_so_far_follows_the_search_direction_and_only_succeeded_trials_compete(
    page: Any, stack: Stack
) -> None:
    page.goto(f"{stack.base_url}/ui/")
    result = page.evaluate(
        """async () => {
            const { bestSoFar, paramAxis } = await import("./trialcharts.js");
            const trials = [
                { number: 1, state: "succeeded", value: 0.5 },
                { number: 0, state: "succeeded", value: 0.7 },
                { number: 2, state: "pruned", value: 0.1 },
                { number: 3, state: "failed", value: null },
                { number: 4, state: "succeeded", value: 0.3 },
            ];
            const choice = paramAxis({ type: "choice", options: [16, "wide", true] }, []);
            const log = paramAxis({ type: "loguniform", low: 0.001, high: 0.01 }, [0.002]);
            return {
                minimize: bestSoFar(trials, "minimize").map((p) => p.best),
                maximize: bestSoFar(trials, "maximize").map((p) => p.best),
                choice: [choice.categories, choice.x(16), choice.x("wide"), choice.x(true)],
                log: [log.log, log.categories, log.x(0.002)],
            };
        }"""
    )
    assert result["minimize"] == [0.7, 0.5, 0.5, 0.5, 0.3]
    assert result["maximize"] == [0.7, 0.7, 0.7, 0.7, 0.7]
    assert result["choice"] == [["16", "wide", "true"], 0, 1, 2]
    assert result["log"] == [True, None, 0.002]
