"""The dashboard's shell: served with its security headers, sign-in with a key kept in session
storage only, a refused key, sign-out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.conftest import Stack
from tests.ui.conftest import sign_in


def test_ui_is_served_with_security_headers(stack: Stack) -> None:
    response = httpx.get(f"{stack.base_url}/ui", follow_redirects=True)
    assert response.status_code == 200
    assert "<title>ACE3</title>" in response.text
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    vendored = httpx.get(f"{stack.base_url}/ui/vendor/uplot/uPlot.iife.min.js")
    assert vendored.status_code == 200 and "uPlot" in vendored.text
    assert httpx.get(f"{stack.base_url}/ui/../pyproject.toml").status_code == 404


def test_sign_in_keeps_the_key_in_session_storage_only(
    page: Any, stack: Stack, ui_key: tuple[str, str], tmp_path: Path
) -> None:
    page.goto(f"{stack.base_url}/ui/")
    page.fill("#api-key", "ace3_000000000000_not-a-real-key")
    page.click("#sign-in button[type=submit]")
    page.wait_for_selector("text=That key was not accepted.")
    assert page.evaluate("sessionStorage.length") == 0

    sign_in(page, stack, ui_key[0])
    assert page.evaluate("sessionStorage.getItem('ace3.apiKey')") == ui_key[0]
    assert page.evaluate("document.cookie") == ""
    assert ui_key[0] not in page.url
    assert page.evaluate("localStorage.length") == 0
    page.screenshot(path=str(tmp_path / "signed-in.png"))

    page.click("#sign-out")
    page.wait_for_selector("#sign-in")
    assert page.evaluate("sessionStorage.length") == 0
    assert page.page_errors == []
    assert all("401" in text for text in page.console_errors), page.console_errors
