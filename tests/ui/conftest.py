"""The dashboard in a real browser: Debian's chromium driven by Playwright for Python, against
the session's real stack. Playwright never downloads a browser here: it is pointed at the
system's chromium (ACE3_TEST_CHROMIUM, else ``chromium`` on PATH, else /usr/bin/chromium)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ace3
from tests.conftest import Stack

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")


def chromium_path() -> str:
    found = os.environ.get("ACE3_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(found).exists():
        pytest.fail(
            "the dashboard's browser tests need chromium: run `bash scripts/ensure-browser.sh` "
            "(Debian: apt-get install chromium) or set ACE3_TEST_CHROMIUM"
        )
    return found


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Chromium for this package's tests. Package-scoped: Playwright's sync API runs an event
    loop in the main thread while it is started, and every later test that calls
    ``asyncio.run`` would fail on it ("cannot be called from a running event loop")."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_path(),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def ui_key(stack: Stack) -> tuple[str, str]:
    """(api key, owner id) of the dashboard tests' owner."""
    return stack.create_key("ui")


@pytest.fixture(scope="session")
def ui_client(stack: Stack, ui_key: tuple[str, str]) -> Iterator[ace3.Client]:
    with ace3.Client(api_key=ui_key[0], base_url=stack.base_url) as client:
        yield client


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    """A fresh browser context (empty session storage) with a 1400x900 window. Console
    errors are collected on ``page.console_errors``, uncaught script errors on
    ``page.page_errors``; a screenshot of the page as the test
    left it is saved as ``tmp_path / "last.png"``."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    console_errors: list[str] = []
    page_errors: list[str] = []
    page.on(
        "console",
        lambda message: console_errors.append(message.text) if message.type == "error" else None,
    )
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    page.console_errors = console_errors  # includes failed requests (an expected 401, say)
    page.page_errors = page_errors  # uncaught exceptions in the page's scripts
    yield page
    try:
        page.screenshot(path=str(tmp_path / "last.png"), full_page=True)
    finally:
        context.close()


def sign_in(page: Any, stack: Stack, key: str, hash_route: str = "#/jobs") -> None:
    """Open the dashboard at ``hash_route`` and sign in with ``key`` through the form."""
    page.goto(f"{stack.base_url}/ui/{hash_route}")
    page.fill("#api-key", key)
    page.click("#sign-in button[type=submit]")
    page.wait_for_selector("#nav:not([hidden])")
