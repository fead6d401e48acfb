"""The job page shows a starting job's phase and its Python environment (issue 28), in a real
browser against the real stack: the job and its environment are rows this test writes (no
training), the job's lease far ahead so that the reconciler leaves it alone."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from playwright.sync_api import expect
from sqlalchemy import update

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Environment, Job, utcnow
from tests.conftest import Stack, insert_job
from tests.ui.conftest import sign_in


def test_the_job_page_shows_the_phase_and_the_environment(
    page: Any, stack: Stack, database_url: str
) -> None:
    env_hash = secrets.token_hex(32)
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        job = insert_job(
            session, state="starting", attempt=1, requirements=["einops>=0.8"],
            phase="preparing_environment", environment_hash=env_hash,
            lease_expires_at=utcnow() + timedelta(hours=1), worker_id="ui-test",
        )  # fmt: skip
        session.add(
            Environment(
                hash=env_hash, state="building", requirements=["einops>=0.8"],
                python="3.11", platform="linux_x86_64", constraints_sha256="0" * 64,
            )
        )  # fmt: skip
        session.commit()
    key, _ = stack.create_key("ui-environment", job.owner_id)
    try:
        sign_in(page, stack, key, f"#/jobs/{job.id}")
        expect(page.locator("#job-phase")).to_contain_text("preparing environment")
        expect(page.locator("#job-requirements")).to_have_text("einops>=0.8")
        expect(page.locator("#job-environment-hash")).to_have_text(env_hash[:16])
        expect(page.locator("#job-environment")).to_contain_text("building")
        # the worker built it and started the job: the stream brings the change
        with sync_session_factory(engine)() as session:
            session.execute(
                update(Environment)
                .where(Environment.hash == env_hash)
                .values(state="ready", packages=[{"name": "einops", "version": "0.8.1"}])
            )
            session.execute(update(Job).where(Job.id == job.id).values(phase=None))
            session.commit()
        expect(page.locator("#job-environment tr[data-package='einops']")).to_contain_text(
            "0.8.1", timeout=20_000
        )
        expect(page.locator("#job-phase")).to_have_count(0)
        assert not page.page_errors
    finally:
        with sync_session_factory(engine)() as session:
            session.execute(
                update(Job).where(Job.id == job.id).values(state="cancelled", phase=None)
            )
            session.commit()
        engine.dispose()
