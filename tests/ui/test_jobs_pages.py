"""The Jobs, Job and Compare pages in a real browser against the real stack: a job's curve
gains points while it trains and the page follows it to `succeeded`, a running job is
cancelled from its page, two jobs' curves are overlaid, the list filters by name and state,
and another owner's job is not found. With ACE3_UPDATE_SCREENSHOTS=1 the job page's
screenshot also replaces the README's docs/images/dashboard.png."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

import ace3
from ace3_control.db import make_sync_engine, sync_session_factory
from tests.conftest import REPO_ROOT, DigitsFiles, Stack, insert_job
from tests.ui.conftest import sign_in

README_SCREENSHOT = REPO_ROOT / "docs" / "images" / "dashboard.png"
RUNNING_STATES = ("queued", "starting", "running")


SLOW_MODEL = """
import time

from torch import nn


def build_model(hidden: int = 32) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def compute_loss(model, batch):
    time.sleep(0.05)  # a slow step, so that the browser sees the job train on any machine
    inputs, targets = batch
    logits = model(inputs)
    return nn.functional.cross_entropy(logits, targets), logits
"""


@pytest.fixture(scope="module")
def ui_key(stack: Stack) -> tuple[str, str]:
    """This module's own owner (the other dashboard tests' jobs stay out of its lists)."""
    return stack.create_key("ui-jobs")


@pytest.fixture(scope="module")
def ui_client(stack: Stack, ui_key: tuple[str, str]) -> Iterator[ace3.Client]:
    with ace3.Client(api_key=ui_key[0], base_url=stack.base_url) as client:
        yield client


@pytest.fixture(scope="module")
def jobs(
    ui_client: ace3.Client, digits_files: DigitsFiles, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, ace3.Job]:
    """Submitted together (the stack's worker has two slots), both with 50 ms steps: "ui-watch"
    trains 2 epochs of 45 steps with a metric every step; "ui-long" would train for hours (it
    is cancelled)."""
    model_file = tmp_path_factory.mktemp("ui-model") / "slow_digits.py"
    model_file.write_text(SLOW_MODEL)
    model = ui_client.load_model(model_file)
    train = ui_client.load_dataset(digits_files.train)
    validation = ui_client.load_dataset(digits_files.validation)
    common = {"batch_size": 32, "learning_rate": 3e-3, "seed": 0}
    watch = ui_client.jobs.create(
        model_id=model.id,
        dataset_id=train.id,
        validation_dataset_id=validation.id,
        config={**common, "epochs": 2, "log_interval": 1},
        name="ui-watch",
    )
    long = ui_client.jobs.create(
        model_id=model.id,
        dataset_id=train.id,
        config={**common, "epochs": 10_000, "log_interval": 5},
        name="ui-long",
    )
    return {"watch": watch, "long": long}


def _points(page: Any, metric: str) -> int:
    return int(page.get_attribute(f"#chart-{metric}", "data-points") or 0)


def _wait_points(page: Any, metric: str, more_than: int, timeout: float = 30) -> int:
    """Poll the chart's data-points from Python (the page's CSP forbids the string evaluation
    that ``page.wait_for_function`` needs)."""
    deadline = time.monotonic() + timeout
    while (points := _points(page, metric)) <= more_than:
        assert time.monotonic() < deadline, f"{metric}: still {points} points after {timeout} s"
        page.wait_for_timeout(100)
    return points


def _page_state(page: Any) -> str:
    return page.get_attribute("#job-state", "data-state") or ""


def test_a_job_page_follows_the_training_live(
    page: Any,
    stack: Stack,
    ui_key: tuple[str, str],
    ui_client: ace3.Client,
    jobs: dict[str, ace3.Job],
    tmp_path: Path,
) -> None:
    job = jobs["watch"]
    sign_in(page, stack, ui_key[0], f"#/jobs/{job.id}")
    page.wait_for_selector("#job-state[data-state=running]", timeout=90_000)
    first = _wait_points(page, "train_loss", 0, timeout=90)  # (torch starting on a busy host)
    second = _wait_points(page, "train_loss", first)
    assert second > first
    assert _page_state(page) == "running", "the curve grew while the job was still training"
    page.wait_for_selector("#job-logs .log-line")

    page.wait_for_selector("#job-state[data-state=succeeded]", timeout=120_000)
    stored = len(ui_client.jobs.metrics(job.id, name="train_loss"))
    assert stored > second
    _wait_points(page, "train_loss", stored - 1)
    assert _points(page, "val_accuracy") >= 1 and _points(page, "learning_rate") >= second
    page.wait_for_selector("#job-checkpoints table")
    assert page.locator("#job-checkpoints .train-again").count() >= 1
    assert not page.locator("#job-cancel").is_visible()

    checkpoint = ui_client.jobs.checkpoints(job.id)[-1]
    with page.expect_download() as download:
        page.locator("#job-checkpoints .download").last.click()
    assert download.value.suggested_filename == checkpoint.name
    saved = tmp_path / checkpoint.name
    download.value.save_as(saved)
    assert saved.stat().st_size == checkpoint.size_bytes

    page.select_option("#log-rank", "rank 0")
    assert page.locator("#job-logs .log-line").count() >= 1
    assert page.locator("#job-logs .log-line:not([data-rank='rank 0'])").count() == 0

    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(tmp_path / "job.png"))
    if os.environ.get("ACE3_UPDATE_SCREENSHOTS") == "1":
        README_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / "job.png", README_SCREENSHOT)
    assert page.page_errors == [] and page.console_errors == []


def test_a_running_job_is_cancelled_from_its_page(
    page: Any,
    stack: Stack,
    ui_key: tuple[str, str],
    ui_client: ace3.Client,
    jobs: dict[str, ace3.Job],
    tmp_path: Path,
) -> None:
    job = jobs["long"]
    sign_in(page, stack, ui_key[0], f"#/compare?ids={job.id}")  # Compare follows it too
    first = _wait_points(page, "train_loss", 0, timeout=90)
    _wait_points(page, "train_loss", first, timeout=20)

    page.goto(f"{stack.base_url}/ui/#/jobs/{job.id}")
    page.wait_for_selector("#job-state[data-state=running]", timeout=90_000)
    with page.expect_event(  # leaving the page closes its event stream
        "requestfailed", predicate=lambda request: f"/v1/jobs/{job.id}/events" in request.url
    ):
        page.goto(f"{stack.base_url}/ui/#/jobs")
    page.goto(f"{stack.base_url}/ui/#/jobs/{job.id}")
    page.wait_for_selector("#job-state[data-state=running]")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#job-cancel")
    page.wait_for_selector("#job-state[data-state=cancelled]", timeout=60_000)
    assert ui_client.jobs.retrieve(job.id).state == "cancelled"
    attempt = page.locator("#job-attempts tbody tr")
    expect(attempt).to_have_count(1)
    expect(attempt.locator(".state")).to_have_text("cancelled")
    expect(attempt.locator("code")).not_to_be_empty()  # the worker's last word on it
    assert not page.locator("#job-cancel").is_visible()
    page.screenshot(path=str(tmp_path / "cancelled.png"))
    assert page.page_errors == []


def test_the_list_filters_and_two_jobs_are_compared(
    page: Any, stack: Stack, ui_key: tuple[str, str], jobs: dict[str, ace3.Job], tmp_path: Path
) -> None:
    watch, long = jobs["watch"], jobs["long"]
    sign_in(page, stack, ui_key[0], "#/jobs")
    page.wait_for_selector(f"tr[data-job-id='{watch.id}']")
    page.wait_for_selector(f"tr[data-job-id='{long.id}']")
    page.screenshot(path=str(tmp_path / "jobs.png"))

    page.fill("#jobs-search", "UI-WAT")
    page.wait_for_selector(f"tr[data-job-id='{long.id}']", state="detached")
    assert page.locator("#jobs-table tbody tr").count() == 1
    assert page.url.endswith("#/jobs?q=UI-WAT"), "the filter is kept in the route"
    page.fill("#jobs-search", "")
    page.wait_for_selector(f"tr[data-job-id='{long.id}']")
    page.select_option("#jobs-state", "cancelled")
    page.wait_for_selector(f"tr[data-job-id='{watch.id}']", state="detached")
    assert page.locator(f"tr[data-job-id='{long.id}'] .state").inner_text() == "cancelled"
    page.select_option("#jobs-state", "")
    page.wait_for_selector(f"tr[data-job-id='{watch.id}']")

    page.goto(f"{stack.base_url}/ui/#/jobs?limit=1")  # one job a page: the API's cursors
    page.wait_for_selector(f"tr[data-job-id='{long.id}']")
    assert page.locator("#jobs-table tbody tr").count() == 1
    page.click("#jobs-next")
    page.wait_for_selector(f"tr[data-job-id='{watch.id}']")
    page.click("#jobs-previous")
    page.wait_for_selector(f"tr[data-job-id='{long.id}']")
    assert page.is_disabled("#jobs-previous")

    page.goto(f"{stack.base_url}/ui/#/jobs")
    page.wait_for_selector(f"tr[data-job-id='{watch.id}']")
    page.check(f"tr[data-job-id='{watch.id}'] input[type=checkbox]")
    page.check(f"tr[data-job-id='{long.id}'] input[type=checkbox]")
    page.click("#jobs-compare")
    page.wait_for_url(f"**#/compare?ids={watch.id},{long.id}")
    _wait_points(page, "train_loss", 0)
    legend = page.locator("#chart-train_loss .u-legend .u-series .u-label")
    assert sorted(legend.all_inner_texts()) == ["step", "ui-long", "ui-watch"]
    page.screenshot(path=str(tmp_path / "compare.png"))

    page.click(f".chip[data-job-id='{long.id}'] .chip-remove")
    page.wait_for_url(f"**#/compare?ids={watch.id}")
    expect(page.locator("#chart-train_loss .u-legend .u-series")).to_have_count(2)
    assert page.page_errors == []


def test_another_owners_job_is_not_found(
    page: Any, stack: Stack, ui_key: tuple[str, str], database_url: str
) -> None:
    engine = make_sync_engine(database_url)
    try:
        with sync_session_factory(engine)() as session:
            theirs = insert_job(session, state="cancelled").id  # (a new owner's)
            session.commit()
    finally:
        engine.dispose()
    sign_in(page, stack, ui_key[0], f"#/jobs/{theirs}")
    page.wait_for_selector("text=Job not found")
    page.goto(f"{stack.base_url}/ui/#/compare?ids={theirs}")
    page.wait_for_selector(f".chip[data-job-id='{theirs}'] >> text=not found")
    page.goto(f"{stack.base_url}/ui/#/jobs")
    page.wait_for_selector("#jobs-table table")
    assert page.locator(f"tr[data-job-id='{theirs}']").count() == 0


def test_a_job_is_trained_again_from_its_checkpoint(
    page: Any,
    stack: Stack,
    ui_key: tuple[str, str],
    ui_client: ace3.Client,
    jobs: dict[str, ace3.Job],
) -> None:
    watch = jobs["watch"]
    checkpoint = ui_client.jobs.checkpoints(watch.id)[-1]
    sign_in(page, stack, ui_key[0], f"#/jobs/{watch.id}")
    page.wait_for_selector("#job-checkpoints .train-again")
    page.once("dialog", lambda dialog: dialog.accept("3"))
    page.locator("#job-checkpoints .train-again").last.click()
    page.wait_for_url(lambda url: "#/jobs/" in url and watch.id not in url)
    again_id = page.url.rsplit("/", 1)[-1]
    try:
        again = ui_client.jobs.retrieve(again_id)
        assert again.resume_from_checkpoint == checkpoint.id
        assert again.config["epochs"] == 3 and again.config["batch_size"] == 32
        assert again.model_id == watch.model_id and again.dataset_id == watch.dataset_id
        page.wait_for_selector("h1 >> text=ui-watch (from")
    finally:
        ui_client.jobs.cancel(again_id)
    assert page.page_errors == []
