"""Fixtures for the SDK tests: a fake ACE3 API over httpx.MockTransport (no network), and
no real sleeping during retries and reconnects."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import ace3
import ace3.client._http
import ace3.client._sse
from tests.unit.sdk.sdk_fakes import MockAPI


@pytest.fixture(autouse=True)
def _isolate(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("ACE3_API_KEY", raising=False)
    monkeypatch.delenv("ACE3_BASE_URL", raising=False)
    ace3.set_default_client(None)
    yield
    ace3.set_default_client(None)


@pytest.fixture(autouse=True)
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every delay the SDK asked to sleep, in order; nothing actually sleeps."""
    slept: list[float] = []
    monkeypatch.setattr(ace3.client._http, "_sleep", slept.append)
    monkeypatch.setattr(ace3.client._sse, "_sleep", slept.append)
    return slept


@pytest.fixture
def api() -> MockAPI:
    return MockAPI()
