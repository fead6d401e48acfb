"""``eval_prompts`` (issue 29, point 2): the config's bounds, the refusals that need no model,
the ``eval_samples`` record's contract (what the worker refuses: too many samples, a NUL or a
terminal escape, an oversize line) and how the engine fits its texts into one line."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

import ace3
from ace3.config import unsupported_settings
from ace3.config.events import (
    MAX_LINE_BYTES,
    MAX_SAMPLE_TEXT_CHARS,
    EvalSamplesRecord,
    RefusedRecord,
    parse_record,
)
from ace3.runtime.loop.eval_samples import Completion, sample_text, samples_record
from ace3_server.services.hf_jobs import eval_prompt_problems


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"eval_prompts": []}, "eval_prompts"),
        ({"eval_prompts": [""]}, "eval_prompts.0"),
        ({"eval_prompts": ["x" * 4001]}, "eval_prompts.0"),
        ({"eval_prompts": ["a\x00b"]}, "eval_prompts.0"),
        ({"eval_prompts": ["p"] * 17}, "eval_prompts"),
        ({"eval_max_new_tokens": 0}, "eval_max_new_tokens"),
        ({"eval_max_new_tokens": 513}, "eval_max_new_tokens"),
    ],
)
def test_the_config_bounds_prompts_and_new_tokens(fields: dict[str, object], where: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ace3.TrainingConfig(**fields)
    assert ".".join(str(part) for part in caught.value.errors()[0]["loc"]) == where


def test_the_largest_config_is_accepted_and_the_default_is_64_tokens() -> None:
    config = ace3.TrainingConfig(eval_prompts=["x\ny\t" * 1000] * 16, eval_max_new_tokens=512)
    assert len(config.eval_prompts or []) == 16
    assert ace3.TrainingConfig().eval_max_new_tokens == 64


def test_pipeline_and_tensor_parallel_runs_are_refused() -> None:
    for layout in ({"pipeline_parallel_size": 2}, {"tensor_parallel_size": 2}):
        config = ace3.TrainingConfig(eval_prompts=["hi"], num_gpus=2, batch_size=8, **layout)
        assert "eval_prompts" in [problem.field for problem in unsupported_settings(config)]
    assert unsupported_settings(ace3.TrainingConfig(eval_prompts=["hi"])) == []


def test_a_model_that_is_not_a_huggingface_directory_is_refused_at_submission() -> None:
    config = ace3.TrainingConfig(eval_prompts=["hi"])
    script = SimpleNamespace(name="net", kind="file")
    [problem] = eval_prompt_problems(script, config, ["body", "config"])
    assert problem["loc"] == ["body", "config", "eval_prompts"]
    assert "Hugging Face model directory" in problem["msg"]
    hf = SimpleNamespace(name="gpt2", kind="huggingface")
    assert eval_prompt_problems(hf, config, ["body", "config"]) == []
    assert eval_prompt_problems(script, ace3.TrainingConfig(), ["body", "config"]) == []


def _line(samples: list[dict[str, object]]) -> bytes:
    return json.dumps(
        {"type": "eval_samples", "step": 3, "max_new_tokens": 8, "samples": samples}
    ).encode()


def _sample(completion: str = "ok") -> dict[str, object]:
    return {"prompt": "p", "completion": completion, "completion_tokens": 1}


def test_the_worker_reads_a_record_and_refuses_malformed_ones() -> None:
    record = parse_record(_line([_sample("line one\n\tline two")]))
    assert isinstance(record, EvalSamplesRecord)
    assert record.samples[0].completion == "line one\n\tline two"
    for bad, reason in [
        (_line([_sample()] * 17), "samples"),
        (_line([]), "samples"),
        (_line([_sample("a\x00b")]), "completion"),
        (_line([_sample("\x1b[2J")]), "completion"),
        (_line([_sample("x" * (MAX_SAMPLE_TEXT_CHARS + 1))]), "completion"),
        (_line([{**_sample(), "html": "<b>"}]), "html"),
        (_line([_sample()]) + b" " * MAX_LINE_BYTES, "longer than"),
    ]:  # fmt: skip
        refused = parse_record(bad)
        assert isinstance(refused, RefusedRecord), bad[:80]
        assert reason in refused.reason, refused.reason


def test_the_engine_fits_every_text_into_one_line_and_says_what_it_cut() -> None:
    assert sample_text("a\r\nb\rc\x00d\x1be\tf") == "a\nb\nc\ufffdd\ufffde\tf"
    short = samples_record(2, 1.0, 8, [Completion("hi", "there", 1)])
    assert short.samples[0].truncated is False
    wide = '\u00e9"' * 5000  # 2 + 2 bytes a pair once escaped: the line must shrink the texts
    record = samples_record(
        5, None, 512, [Completion(wide, wide, 512, prompt_cut=index == 0) for index in range(16)]
    )
    line = record.model_dump_json().encode()
    assert len(line) <= MAX_LINE_BYTES
    assert isinstance(parse_record(line), EvalSamplesRecord)
    assert all(sample.truncated for sample in record.samples)
    assert 0 < len(record.samples[0].completion) < MAX_SAMPLE_TEXT_CHARS
