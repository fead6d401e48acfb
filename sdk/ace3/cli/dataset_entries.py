"""A job or search file's ``dataset:`` and ``validation_dataset:``: a local path to upload, or
``{id: <dataset id>}``, a dataset the service already stores (uploaded earlier, or registered
from a bucket with ``ace3 datasets register``; ``ace3 datasets list`` shows the ids), used as
it is: nothing is uploaded. On the command line: ``dataset.id=<id>``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ace3.cli.errors import BAD_INPUT, CLIError

DATASET_KEYS = ("dataset", "validation_dataset")
# A stored dataset's id (the service's are hex uuids): one URL path segment, nothing else.
DATASET_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,100}$")


class DatasetById(BaseModel):
    """``dataset: {id: ...}``: a stored dataset, by its id."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=DATASET_ID_RE.pattern)


def path_or_id(value: Any) -> Any:
    """Before the union: a non-empty string or a mapping (checked by
    :func:`check_dataset_ids`) passes; anything else is one message naming the key (not one per
    union member)."""
    if isinstance(value, dict | DatasetById):
        return value
    if isinstance(value, str):
        if not value:
            raise ValueError("an empty path: give a path to upload, or {id: <dataset id>}")
        return value
    raise ValueError(
        f"a path to upload, or {{id: <dataset id>}} for a stored dataset, not "
        f"{type(value).__name__}"
    )


def path_id_or_none(value: Any) -> Any:
    return None if value is None else path_or_id(value)


#: ``dataset:`` once validated: an absolute path, or a stored dataset's id
DatasetEntry = Annotated[str | DatasetById, BeforeValidator(path_or_id)]
#: ``validation_dataset:``: the same, or None
OptionalDatasetEntry = Annotated[str | DatasetById | None, BeforeValidator(path_id_or_none)]


def check_dataset_ids(source: Path, data: dict[str, Any]) -> None:
    """A ``dataset``/``validation_dataset`` mapping must be ``{id: <dataset id>}``: a
    :class:`CLIError` naming the key and what is wrong (before pydantic's union messages)."""
    for key in DATASET_KEYS:
        value = data.get(key)
        if not isinstance(value, dict):
            continue
        how = f"a mapping names a stored dataset by its id, {key}: {{id: <dataset id>}}"
        unknown = sorted(str(name) for name in value if name != "id")
        if unknown:
            raise _problem(source, f"unknown key '{key}.{unknown[0]}': {how} (or give a path)")
        if "id" not in value:
            raise _problem(source, f"{key}.id: required key missing: {how}")
        ident = value["id"]
        if not isinstance(ident, str):
            raise _problem(
                source,
                f"{key}.id: a dataset id is a string, got {ident!r}: quote it "
                f"({key}: {{id: '...'}}; on the command line {key}.id=\"'...'\")",
            )
        if not DATASET_ID_RE.match(ident):
            raise _problem(
                source,
                f"{key}.id: {ident!r} is not a dataset id (letters, digits, '-' and '_'; "
                "`ace3 datasets list` shows yours)",
            )


def _problem(source: Path, message: str) -> CLIError:
    return CLIError(f"{source}: {message}", BAD_INPUT)
