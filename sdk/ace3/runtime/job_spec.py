"""The job file (``job.json``) the worker writes and every rank reads: a pydantic model.

The training settings reuse :class:`ace3.config.TrainingConfig`, the shared wire contract.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ace3.config import TrainingConfig
from ace3.config.shards import StreamFormat, TokenDtype
from ace3.config.text_records import RecordKind


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Strict):
    """Where the user's model code lives and how to build the model from it."""

    path: str = Field(
        description="kind=file: the .py file; kind=archive: a directory on sys.path; "
        "kind=huggingface: a model directory (config.json, safetensors, tokenizer)."
    )
    kind: Literal["file", "archive", "huggingface"] = "file"
    entry_module: str | None = Field(None, description="kind=archive: dotted module to import.")
    factory: str = Field("build_model", min_length=1, description="Function or class to call.")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Passed to the factory.")

    @model_validator(mode="after")
    def _check_archive(self) -> ModelSpec:
        if self.kind == "archive" and not self.entry_module:
            raise ValueError("model.kind='archive' needs model.entry_module (the module to import)")
        return self


class StreamShard(_Strict):
    """One shard of a streamed dataset, as the job sees it."""

    file: str = Field(description="Its file name in the dataset's directory (shard_file_name).")
    size: int = Field(ge=0, description="Bytes.")
    samples: int | None = Field(None, ge=0, description="Samples, where the format records it.")


class StreamSpec(_Strict):
    """A sharded dataset the worker streams into ``DatasetSpec.path`` while the job runs: each
    shard's file appears there (read-only, whole, verified) once the worker has fetched it; the
    readers ask for the ones they need next with request files in ``requests``
    (:mod:`ace3.config.shards`)."""

    format: StreamFormat
    dtype: TokenDtype | None = None
    columns: dict[Literal["inputs", "targets"], str] | None = None
    labels: Literal["next", "inputs"] = Field(
        "next",
        description="tokens: 'next', labels are the next tokens (input_ids shifted by one); "
        "'inputs', labels are input_ids, for a model that shifts them itself (a Hugging Face "
        "causal LM: the worker asks for it for a stored model directory).",
    )
    shards: list[StreamShard] = Field(min_length=1, description="In the manifest's order.")
    requests: str = Field(description="The directory the readers write request files into.")


class DatasetSpec(_Strict):
    """A dataset file (.pt, .npz, .csv, .jsonl) or a directory; or, with ``stream``, the
    directory a sharded dataset's shards appear in."""

    path: str
    stream: StreamSpec | None = None
    records: RecordKind | None = Field(
        None,
        description="The kind of text records the dataset named (records= at upload): the job "
        "reads its .jsonl as such records instead of telling the kind from the first one.",
    )


class TeacherSpec(_Strict):
    """The distillation teacher: its model code (``model.kwargs`` from the config's
    ``teacher_model_kwargs``) and, optionally, a weights file loaded into it."""

    model: ModelSpec
    checkpoint: str | None = Field(None, description="The teacher's weights file.")
    checkpoint_sha256: str | None = Field(
        None, pattern=r"^[0-9a-fA-F]{64}$", description="Expected sha256 of checkpoint."
    )


class JobSpec(_Strict):
    """Everything one attempt of a job needs; see docs/runtime.md."""

    job_id: str
    attempt: int = Field(1, ge=1)
    config: TrainingConfig
    model: ModelSpec
    dataset: DatasetSpec
    validation_dataset: DatasetSpec | None = None
    output_dir: str
    resume_from: str | None = None
    resume_sha256: str | None = Field(
        None, pattern=r"^[0-9a-fA-F]{64}$", description="Expected sha256 of resume_from."
    )
    init_from: str | None = Field(
        None, description="Model weights to start from (config.init_from_checkpoint_id's file)."
    )
    init_from_sha256: str | None = Field(
        None, pattern=r"^[0-9a-fA-F]{64}$", description="Expected sha256 of init_from."
    )
    teacher: TeacherSpec | None = Field(
        None, description="The distillation teacher (config.distillation set)."
    )
    micro_batch_split: int = Field(
        1,
        ge=1,
        le=1 << 20,
        description="Run each loader batch as this many micro-batches (the worker doubles it "
        "for the attempt after one that ran out of memory; the effective batch is unchanged).",
    )
    environment: str | None = Field(
        None,
        description="The directory of the packages the job asked for (its requirements), "
        "read-only; added to sys.path after the worker's own packages, never ahead of them.",
    )


def load_job_spec(path: str | Path) -> JobSpec:
    """Read and validate ``job.json``; errors name the file."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"job file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"job file {path} is not valid JSON: {exc}") from exc
    return JobSpec.model_validate(raw)
