"""The strict base of the config schemas and the names of the offload fields (imported by
:mod:`.training` and by the checks that read a config; it imports nothing of this package)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Schema(BaseModel):
    """Strict base: unknown fields are an error (a typo must never be silently ignored)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


#: The three switches that offload sharded state to CPU memory (any one turns offload on).
OFFLOAD_FIELDS = ("cpu_offload", "offload_optimizer", "offload_parameters")
