"""``ace3 jobs samples JOB``: the latest ``eval_samples`` record, read typed by the SDK
(``JobRecord.record`` an ``EvalSamplesRecord``), printed prompt by prompt; none yet says so."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ace3.cli import build_parser
from ace3.cli import jobs as cli_jobs
from ace3.client.types import JobRecord, RecordPage
from ace3.config.events import EvalSamplesRecord

PAYLOAD = {
    "type": "eval_samples",
    "step": 40,
    "epoch": 2.0,
    "max_new_tokens": 16,
    "samples": [
        {"prompt": "Say hi", "completion": "<b>hi</b>\nthere", "completion_tokens": 5},
        {"prompt": "Count", "completion": "1 2 3", "completion_tokens": 16, "truncated": True},
    ],
}


def _run(monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    asked: list[dict[str, Any]] = []

    def record_page(job_id: str, **params: Any) -> RecordPage:
        asked.append({"job_id": job_id, **params})
        return RecordPage(data=[JobRecord.model_validate(row) for row in rows], next_after=None)

    client = SimpleNamespace(jobs=SimpleNamespace(record_page=record_page))
    monkeypatch.setattr(cli_jobs, "make_client", lambda: client)
    args = build_parser().parse_args(["jobs", "samples", "job-1"])
    assert args.func(args) == 0
    return asked


def test_the_latest_samples_are_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    row = {"id": 7, "attempt": 1, "type": "eval_samples", "step": 40, "record": PAYLOAD}
    assert isinstance(JobRecord.model_validate(row).record, EvalSamplesRecord)
    asked = _run(monkeypatch, [row])
    assert asked == [{"job_id": "job-1", "type": "eval_samples", "order": "newest", "limit": 1}]
    assert capsys.readouterr().out == (
        "eval samples at step 40, epoch 2 (at most 16 tokens)\n"
        "\n> Say hi\n<b>hi</b>\nthere\n"
        "\n> Count\n1 2 3 (truncated)\n"
    )


def test_a_job_without_samples_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(monkeypatch, [])
    assert "has no eval_samples yet" in capsys.readouterr().out
