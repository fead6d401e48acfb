"""LoRA targets against a stored Hugging Face model's module names at submission: an entry that
matches no module is refused naming it and the module kinds; matching ones, 'all-linear', and
models whose names are unknown pass."""

from __future__ import annotations

from types import SimpleNamespace

import ace3
from ace3_server.services.lora_targets import lora_target_problems

GPT2 = SimpleNamespace(
    name="gpt2",
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
