"""ZeRO settings in TrainingConfig: the stage that runs, offload's rule, refused combinations."""

from __future__ import annotations

import pydantic
import pytest

import ace3
from ace3.config import unsupported_settings


def test_offload_without_a_stage_runs_zero_3() -> None:
    snippet = ace3.TrainingConfig(cpu_offload=True, offload_optimizer=True, offload_parameters=True)
    assert (snippet.zero_stage, snippet.effective_zero_stage, snippet.offload) == (0, 3, True)
    for field in ("cpu_offload", "offload_optimizer", "offload_parameters"):
        assert ace3.TrainingConfig(**{field: True}).effective_zero_stage == 3
    assert ace3.TrainingConfig(zero_stage=2, cpu_offload=True).effective_zero_stage == 2
    assert ace3.TrainingConfig(zero_stage=1).effective_zero_stage == 1
    assert ace3.TrainingConfig().effective_zero_stage == 0


@pytest.mark.parametrize("field", ["cpu_offload", "offload_optimizer", "offload_parameters"])
def test_offload_with_stage_1_is_an_error_naming_the_fix(field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=f"{field}=True needs zero_stage 2 or 3"):
        ace3.TrainingConfig(zero_stage=1, **{field: True})
    config = ace3.TrainingConfig(zero_stage=1)
    with pytest.raises(pydantic.ValidationError, match=field):
        setattr(config, field, True)
    assert getattr(config, field) is False  # a refused assignment keeps the old value
    offloading = ace3.TrainingConfig(**{field: True})
    with pytest.raises(
        pydantic.ValidationError, match="zero_stage=1 \\(ZeroRedundancyOptimizer\\)"
    ):
        offloading.zero_stage = 1
    assert offloading.zero_stage == 0


@pytest.mark.parametrize(
    ("config", "field", "message"),
    [
        (
            dict(zero_stage=2, mixed_precision=True, amp_level="O2"),
            "amp_level",
            "use amp_level='O1'",
        ),
        (dict(zero_stage=1, mixed_precision=True, amp_level="O3"), "amp_level", "or zero_stage=0"),
        (
            dict(cpu_offload=True, mixed_precision=True, amp_level="O2"),
            "amp_level",
            "turn offload off",
        ),
        (dict(zero_stage=3, optimizer="memory_efficient_adam"), "optimizer", "or zero_stage=1"),
        (
            dict(offload_parameters=True, optimizer="adam8bit"),
            "optimizer",
            "use adamw, adam or sgd",
        ),
        (
            dict(zero_stage=2, tensorboard={"log_graph": True, "log_histograms": True}),
            "tensorboard",
            "log_graph and log_histograms with zero_stage=2",
        ),
    ],
)
def test_combinations_not_implemented_with_zero_are_refused(config, field, message) -> None:
    problems = unsupported_settings(ace3.TrainingConfig(**config))
    assert [p.field for p in problems] == [field]
    assert message in problems[0].reason and "not implemented" in problems[0].reason


def test_combinations_that_run_with_zero_are_accepted() -> None:
    for config in [
        dict(zero_stage=1, optimizer="adam8bit"),  # plain tensors under ZeroRedundancyOptimizer
        dict(zero_stage=3, mixed_precision=True, amp_level="O1"),
        dict(zero_stage=2, amp_level="O2"),  # without mixed_precision O2 means O0
        dict(zero_stage=3, gradient_checkpointing=True, max_grad_norm=1.0),
        dict(zero_stage=3, tensorboard={"log_images": True}),  # scalars and images are fine
        dict(zero_stage=1, tensorboard={"log_graph": True}),  # a replicated model
    ]:
        assert unsupported_settings(ace3.TrainingConfig(**config)) == [], config
