"""The environment settings of :class:`~ace3.config.training.TrainingConfig`: the packages a job
adds to the worker's Python (docs/environments.md). Kept apart so that the training schema
stays readable; ``TrainingConfig`` inherits them.

The entries are checked by the API (a 422 naming the entry: URLs, paths and pip options are
refused, :mod:`ace3.config.requirements`), not when the config is built, so that the SDK, the
CLI and a plain HTTP client all get the same answer from the service.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ace3.config.requirements import MAX_ENTRY_CHARS, MAX_REQUIREMENTS

RequirementEntry = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_ENTRY_CHARS)
]


class EnvironmentFields(BaseModel):
    """``requirements``: PEP 508 entries (``"einops>=0.8"``, ``"torchvision==0.28.*"``) the
    job's Python gets on top of the worker's own packages."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    requirements: list[RequirementEntry] = Field(
        default_factory=list,
        max_length=MAX_REQUIREMENTS,
        description="Packages the job imports beyond the worker's own (PEP 508 names with "
        "version specifiers and extras, e.g. ['torchvision==0.28.*', 'einops>=0.8']), merged "
        "with a model package's requirements.txt. The worker builds one environment per set "
        "(wheels only, resolved against its own torch and packages, which it never replaces) "
        "and reuses it for every job that asks for the same. URLs, paths and pip options are "
        "refused (422). In process (ace3.Trainer) they are checked against the local Python.",
    )
