"""Progress display: a live bar on a terminal, plain lines elsewhere, both showing metrics
and logs."""

from __future__ import annotations

import io

import ace3
from ace3.client.types import JobEvent
from ace3.follow.job_display import PlainDisplay, RichDisplay, StepEstimator, create_display
from tests.unit.sdk.sdk_fakes import job_json, log, metric


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


# What the worker stores from the engine's start record (ace3.config.events.RunPlan).
PLAN = {"total_steps": 20, "steps_per_epoch": 10, "epochs": 2, "world_size": 1,
        "resumed_from_step": 0}  # fmt: skip


def events() -> list[JobEvent]:
    """The stream of a job as the engine reports it: integer (1-based) epochs, the plan on the
    running job before the first metric."""
    return [
        JobEvent("state", ace3.Job.model_validate(job_json(state="running"))),
        JobEvent("state", ace3.Job.model_validate(job_json(state="running", plan=PLAN))),
        JobEvent("metric", ace3.Metric.model_validate(metric(1, "train_loss", 0.75, epoch=1))),
        JobEvent(
            "metric", ace3.Metric.model_validate(metric(1, "samples_per_sec", 1234.5, epoch=1))
        ),
        # (a per-rank series: in the metrics, not in the plain line; its max would be)
        JobEvent("metric", ace3.Metric.model_validate(metric(1, "memory_mb_rank0", 3.0, epoch=1))),
        JobEvent("log", ace3.LogLine.model_validate(log(1, "loading [data]", rank=1))),
        JobEvent("metric", ace3.Metric.model_validate(metric(10, "val_accuracy", 0.9, epoch=1))),
        JobEvent(
            "end",
            ace3.Job.model_validate(
                job_json(state="succeeded", plan=PLAN, final_metrics={"val_accuracy": 0.9})
            ),
        ),
    ]


def test_a_terminal_gets_the_live_bar_with_metrics_and_logs(monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    out = FakeTerminal()
    display = create_display(None, {"epochs": 2}, mode="auto", file=out)
    assert isinstance(display, RichDisplay)
    with display:
        for event in events():
            display.handle(event)
    assert display.steps.total == 20
    text = out.getvalue()
    assert "[rank 1] loading [data]" in text  # printed verbatim, not as rich markup
    assert "loss=0.75" in text and "val_acc=0.9" in text and "samples/s=1,234" in text
    assert "job job_1 succeeded" in text


def test_not_a_terminal_or_show_progress_false_gives_plain_lines():
    assert isinstance(create_display(None, {}, mode="auto", file=io.StringIO()), PlainDisplay)
    out = FakeTerminal()
    display = create_display(None, {"epochs": 2}, mode="plain", file=out)
    assert isinstance(display, PlainDisplay)
    with display:
        for event in events():
            display.handle(event)
    lines = out.getvalue().splitlines()
    assert lines == [
        "job job_1: running",
        "step 1/20 epoch 1: train_loss=0.75 samples_per_sec=1,234",
        "[rank 1] loading [data]",
        "step 10/20 epoch 1: val_accuracy=0.9",
        "job job_1 succeeded after 0s | val_accuracy=0.9",
    ]
    assert "\x1b" not in out.getvalue()


def test_none_mode_shows_nothing(capsys):
    with create_display(None, {}, mode="none") as display:
        for event in events():
            display.handle(event)
    assert capsys.readouterr().out == ""


def test_step_total_from_the_plan_from_step_1():
    estimator = StepEstimator({"epochs": 3})
    assert estimator.total is None  # indeterminate until the plan arrives
    estimator.observe(ace3.Metric(step=1, name="train_loss", value=2.0, epoch=1))
    assert estimator.total is None
    estimator.use_plan(ace3.Job.model_validate(job_json(plan=PLAN)).plan)
    assert estimator.total == 20
    # A newer server's plan with keys this SDK does not know still decodes.
    job = ace3.Job.model_validate(job_json(plan={**PLAN, "new_field": 1}))
    assert job.plan is not None and job.plan.total_steps == 20


def test_step_total_without_a_plan_from_epoch_loss_or_max_steps():
    estimator = StepEstimator({"epochs": 3})
    estimator.observe(ace3.Metric(step=10, name="train_loss", value=1.0, epoch=1))
    assert estimator.total is None, "an integer epoch mid-epoch says nothing"
    estimator.observe(ace3.Metric(step=10, name="epoch_train_loss", value=1.0, epoch=1))
    assert estimator.total == 30
    capped = StepEstimator({"epochs": 3, "max_steps": 50})
    assert capped.total == 50
    capped.observe(ace3.Metric(step=8, name="val_loss", value=1.0, epoch=1))
    assert capped.total == 50, "validation can run mid-epoch (max_steps): it says nothing"
    capped.observe(ace3.Metric(step=8, name="epoch_train_loss", value=1.0, epoch=1))
    assert capped.total == 24


def test_plain_lines_show_each_metric_once_not_again_in_the_engine_log_echo():
    out = io.StringIO()
    echo = "step 1 epoch 1 train_loss=0.75000 lr=0.001 samples/s=1234"
    stream = [
        JobEvent("state", ace3.Job.model_validate(job_json(state="running", plan=PLAN))),
        JobEvent("metric", ace3.Metric.model_validate(metric(1, "train_loss", 0.75, epoch=1))),
        JobEvent("log", ace3.LogLine.model_validate(log(1, echo, rank=0))),
        JobEvent("log", ace3.LogLine.model_validate(log(2, "validation at step 1: val_loss=0.5"))),
        JobEvent("log", ace3.LogLine.model_validate(log(3, "epoch 1 done: val_loss=0.50000"))),
        JobEvent("log", ace3.LogLine.model_validate(log(4, "resumed from step 0", rank=0))),
        # a user's own prints that start like the engine's lines are not its echo
        JobEvent("log", ace3.LogLine.model_validate(log(5, "epoch 3 done: saved to /tmp/x"))),
        JobEvent("log", ace3.LogLine.model_validate(log(6, "done: wrote predictions.csv"))),
        JobEvent("log", ace3.LogLine.model_validate(log(7, "validation at step 5: ok", rank=0))),
        JobEvent("log", ace3.LogLine.model_validate(log(8, echo, rank=1))),
    ]
    with create_display(None, {"epochs": 2}, mode="plain", file=out) as display:
        for event in stream:
            display.handle(event)
    assert out.getvalue().splitlines() == [
        "job job_1: running",
        "step 1/20 epoch 1: train_loss=0.75",
        "[rank 0] resumed from step 0",
        "[rank 0] epoch 3 done: saved to /tmp/x",
        "[rank 0] done: wrote predictions.csv",
        "[rank 0] validation at step 5: ok",
        f"[rank 1] {echo}",
    ]


def test_a_queued_job_shows_its_place_and_why_it_waits() -> None:
    from ace3.follow.job_display import queue_note

    job = ace3.Job.model_validate(
        job_json(state="queued", queue_position=3, waiting_reason="quota")
    )
    note = " (position 3 in the queue, waiting for its owner's quota)"
    assert queue_note(job) == note
    assert queue_note(job.model_copy(update={"state": "running"})) == ""
    assert queue_note(job.model_copy(update={"queue_position": None})) == ""
    out = io.StringIO()
    display = create_display(None, {}, mode="plain", file=out)
    display.handle(JobEvent("state", job))
    assert f"job {job.id}: queued{note}" in out.getvalue()


def test_a_job_preparing_its_environment_says_so_on_both_displays(monkeypatch) -> None:
    """While a starting job's environment is prepared (its ``phase``) the line says so; the
    phase ending is a change the display shows."""
    preparing = ace3.Job.model_validate(job_json(state="starting", phase="preparing_environment"))
    started = preparing.model_copy(update={"phase": None})
    out = io.StringIO()
    display = create_display(None, {}, mode="plain", file=out)
    for job in (preparing, preparing, started):
        display.handle(JobEvent("state", job))
    assert out.getvalue().splitlines() == [
        "job job_1: starting: preparing environment",
        "job job_1: starting",
    ]
    monkeypatch.setenv("COLUMNS", "160")
    terminal = FakeTerminal()
    with create_display(None, {}, mode="auto", file=terminal) as live:
        live.handle(JobEvent("state", preparing))
    assert "starting: preparing environment" in terminal.getvalue()
