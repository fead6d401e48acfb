"""ACE3_LOG_FORMAT=json: one valid JSON object a line (timestamp, level, logger, message,
request_id when serving a request, exception), for uvicorn's loggers, ours and Celery's."""

from __future__ import annotations

import io
import json
import logging
import logging.config
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from ace3_control.log_format import (
    JsonFormatter,
    request_id_var,
    use_formatter,
    uvicorn_log_config,
)
from ace3_control.settings import Settings


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("ace3_test.log_format")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_each_line_is_one_json_object(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.info("job %s claimed\nsecond line", "abc")
    token = request_id_var.set("req-1")
    try:
        logger.warning('quote " and ünïcode')
    finally:
        request_id_var.reset(token)
    first, second = lines(stream)
    assert first["message"] == "job abc claimed\nsecond line"
    assert (first["level"], first["logger"]) == ("INFO", "ace3_test.log_format")
    assert str(first["timestamp"]).endswith("+00:00") and "request_id" not in first
    assert second == {**second, "message": 'quote " and ünïcode', "request_id": "req-1"}
    assert "exception" not in first


def test_the_exception_is_one_field(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    [entry] = lines(stream)
    assert entry["message"] == "failed" and entry["level"] == "ERROR"
    assert "Traceback" in str(entry["exception"]) and "ValueError: boom" in str(entry["exception"])


def test_uvicorn_config_makes_uvicorn_and_our_loggers_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert uvicorn_log_config("text", "info") is None
    config = uvicorn_log_config("json", "info")
    assert config is not None
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        logging.config.dictConfig(config)
        logging.getLogger("uvicorn.error").info("Started server process")
        logging.getLogger("uvicorn.access").info('%s - "%s %s"', "127.0.0.1", "GET", "/healthz")
        logging.getLogger("ace3_server.reconciler").warning("re-published %d", 2)
        logging.getLogger("ace3_server.reconciler").debug("not at info")
    finally:
        for name in ("uvicorn", "uvicorn.access"):
            logging.getLogger(name).handlers.clear()
        root.handlers[:], root.level = saved
    entries = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(e["logger"], e["message"]) for e in entries] == [
        ("uvicorn.error", "Started server process"),
        ("uvicorn.access", '127.0.0.1 - "GET /healthz"'),
        ("ace3_server.reconciler", "re-published 2"),
    ]


def test_celery_handlers_write_json_with_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    from ace3_worker import celery_app

    stream = io.StringIO()
    logger = logging.getLogger("ace3_test.celery")
    logger.propagate = False
    logger.handlers = [logging.StreamHandler(stream)]
    monkeypatch.setattr(celery_app, "settings", Settings(log_format="text"))
    celery_app._json_logs(logger=logger)
    logger.warning("plain")
    monkeypatch.setattr(celery_app, "settings", Settings(log_format="json"))
    task = SimpleNamespace(name="ace3.run_job", request=SimpleNamespace(id="t-1"))
    monkeypatch.setattr(celery_app, "get_current_task", lambda: task)
    try:
        celery_app._json_logs(logger=logger)
    finally:
        logging.captureWarnings(False)
    logger.warning("as json")
    plain, as_json = stream.getvalue().splitlines()
    assert plain == "plain"
    entry = json.loads(as_json)
    assert (entry["message"], entry["task_id"], entry["task_name"]) == (
        "as json",
        "t-1",
        "ace3.run_job",
    )


def test_an_unknown_log_format_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACE3_LOG_FORMAT", "xml")
    with pytest.raises(ValidationError, match="log_format"):
        Settings()
    monkeypatch.setenv("ACE3_LOG_FORMAT", "json")
    assert Settings().log_format == "json"


def test_use_formatter_replaces_every_handler_formatter() -> None:
    logger = logging.getLogger("ace3_test.use_formatter")
    logger.handlers = [logging.StreamHandler(io.StringIO()), logging.StreamHandler(io.StringIO())]
    formatter = JsonFormatter()
    use_formatter(logger, formatter)
    assert all(handler.formatter is formatter for handler in logger.handlers)
    logger.handlers = []


def test_ace3_server_hands_uvicorn_the_json_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import uvicorn

    from ace3.cli import service as cli
    from ace3_server import migrations_check

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append(kwargs))
    monkeypatch.setattr(migrations_check, "ensure_migrated", lambda url: None)
    for log_format in ("text", "json"):
        settings = Settings(data_dir=tmp_path, log_format=log_format)
        monkeypatch.setattr(cli, "_settings", lambda settings=settings: settings)
        assert cli.cmd_server(SimpleNamespace(host="127.0.0.1", port=0)) == 0
    text, as_json = calls
    assert "log_config" not in text  # uvicorn's own text setup
    assert as_json["log_config"]["root"]["handlers"] == ["json"]
    # The worker prints no banner in JSON mode (Celery's global --quiet, before `worker`).
    assert cli.worker_argv(Settings(log_format="json"))[:2] == ["--quiet", "worker"]
    assert cli.worker_argv(Settings(log_format="text"))[0] == "worker"
