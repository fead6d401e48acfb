"""A stored Hugging Face model's jobs at submission: LoRA targets against its module names: an entry that
matches no module is refused naming it and the module kinds; matching ones, 'all-linear', and
models whose names are unknown pass."""

from __future__ import annotations

from types import SimpleNamespace

import ace3
from ace3_server.services.hf_jobs import hf_layout_problems, lora_target_problems

GPT2 = SimpleNamespace(
    name="gpt2",
    kind="huggingface",
    parameter_count=1_000,
    module_names=[f"transformer.h.{i}.{m}" for i in (0, 1)
                  for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "ln_1")]
    + ["transformer.wte", "transformer.wpe", "transformer.ln_f"],
)  # fmt: skip
LOC: list[str | int] = ["body", "config"]


def _config(targets: list[str] | str) -> ace3.TrainingConfig:
    return ace3.TrainingConfig(lora=ace3.LoRAConfig(target_modules=targets))


def test_an_entry_that_matches_no_module_is_refused_with_the_module_kinds() -> None:
    [problem] = lora_target_problems(GPT2, _config(["c_attn", "q_proj"]), LOC)
    assert problem["loc"] == ["body", "config", "lora", "target_modules", 1]
    assert problem["msg"] == (
        "'q_proj' matches no module of model 'gpt2'; the last parts of its module names: "
        "c_attn, c_fc, c_proj, ln_1, ln_f, wpe, wte (or 'all-linear')"
    )


def test_matching_entries_all_linear_and_unknown_names_pass() -> None:
    for targets in (["c_attn", "h.*.mlp.c_fc", "transformer.h.0.attn.c_proj"], "all-linear"):
        assert lora_target_problems(GPT2, _config(targets), LOC) == []
    unknown = SimpleNamespace(name="m", module_names=None)
    assert lora_target_problems(unknown, _config(["q_proj"]), LOC) == []
    assert lora_target_problems(GPT2, ace3.TrainingConfig(), LOC) == []


def test_tensor_or_pipeline_parallelism_and_an_export_past_the_artifact_cap_are_refused() -> None:
    split = ace3.TrainingConfig(num_gpus=4, tensor_parallel_size=2, pipeline_parallel_size=2)
    found = hf_layout_problems(GPT2, split, LOC, max_artifact_bytes=None)
    assert [p["loc"][-1] for p in found] == ["tensor_parallel_size", "pipeline_parallel_size"]
    assert "has none of: use data parallelism or ZeRO" in found[0]["msg"]
    [big] = hf_layout_problems(GPT2, ace3.TrainingConfig(), LOC, max_artifact_bytes=3_999)
    assert big["loc"] == ["body", "model_id"] and "about 4,000 bytes" in big["msg"]
    assert hf_layout_problems(GPT2, ace3.TrainingConfig(zero_stage=3, num_gpus=2), LOC, 4_000) == []
    model_file = SimpleNamespace(kind="file", parameter_count=None)
    assert hf_layout_problems(model_file, split, LOC, max_artifact_bytes=1) == []
