"""The environment settings a worker refuses at start: a build uid that is one of the job uids
(a job could then reach a build's scratch directory and the processes unpacking other owners'
wheels), and blank ACE3_PIP_* values read as unset (what compose passes for an unset one)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ace3_control.settings import Settings


@pytest.mark.parametrize("uid", [61000, 61063])
def test_a_build_uid_among_the_job_uids_is_refused_naming_both(uid: int) -> None:
    with pytest.raises(ValidationError, match=f"ACE3_ENV_BUILD_UID={uid} is one of the job uids"):
        Settings(env_build_uid=uid, sandbox_uid_base=61000, sandbox_uid_count=64)


def test_a_build_uid_beside_the_job_uids_is_accepted() -> None:
    assert Settings(env_build_uid=61064, sandbox_uid_base=61000, sandbox_uid_count=64)
    assert Settings().env_build_uid == 65534


def test_blank_wheel_sources_are_unset() -> None:
    settings = Settings(pip_index_url="  ", pip_extra_index_url="", pip_find_links=" ")
    assert (settings.pip_index_url, settings.pip_extra_index_url, settings.pip_find_links) == (
        None,
        None,
        None,
    )
