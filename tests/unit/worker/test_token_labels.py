"""A Hugging Face model's tokens streams give the input ids as labels (the model shifts them
itself); every other model's give the next tokens, and other formats are left alone."""

from __future__ import annotations

import copy
from typing import Any

from ace3.runtime.job_spec import StreamSpec
from ace3_worker.job_dir import set_token_labels


def _spec(train_format: str, validation_format: str | None) -> dict[str, Any]:
    def entry(data_format: str) -> dict[str, Any]:
        stream = {"format": data_format, "shards": [{"file": "0.bin", "size": 8}], "requests": "/r"}
        return {"path": "/data", "stream": stream}

    return {
        "dataset": entry(train_format),
        "validation_dataset": entry(validation_format) if validation_format else None,
    }


def test_a_hugging_face_model_reads_tokens_with_the_input_ids_as_labels() -> None:
    spec = _spec("tokens", "tokens")
    set_token_labels(spec, "huggingface")
    for entry in (spec["dataset"], spec["validation_dataset"]):
        assert StreamSpec.model_validate(entry["stream"]).labels == "inputs"


def test_other_models_and_formats_are_left_alone() -> None:
    for kind, spec in (("file", _spec("tokens", None)), ("huggingface", _spec("parquet", None))):
        before = copy.deepcopy(spec)
        set_token_labels(spec, kind)
        assert spec == before
        assert StreamSpec.model_validate(spec["dataset"]["stream"]).labels == "next"
