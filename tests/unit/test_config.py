"""The seed document's configurations: every field is accepted; what the engine cannot do yet
is refused with its reason (never silently ignored); bad values name their field."""

from __future__ import annotations

import pydantic
import pytest

import ace3
from ace3.config import unsupported_settings


def _refused(config: ace3.TrainingConfig) -> set[str]:
    return {problem.field for problem in unsupported_settings(config)}


def test_quick_start_data_parallel_amp_and_accumulation_configs_run_as_is() -> None:
    configs = [
        ace3.TrainingConfig(num_gpus=4, batch_size=32, learning_rate=1e-4, mixed_precision=True),
        ace3.TrainingConfig(
            parallelism="data", num_gpus=8, batch_size=256, gradient_accumulation_steps=4
        ),
        ace3.TrainingConfig(mixed_precision=True, amp_level="O1", loss_scaling="dynamic"),
        ace3.TrainingConfig(batch_size=32, gradient_accumulation_steps=8, max_grad_norm=1.0),
        ace3.DistributedConfig(num_gpus=4, backend="nccl").to_training_config(),
        ace3.TrainingConfig(learning_rate=1e-4, batch_size=32, weight_decay=0.01),
    ]
    for config in configs:
        assert _refused(config) == set(), config


def test_zero_stages_and_the_cpu_offloading_snippet_run_as_is() -> None:
    configs = [
        ace3.TrainingConfig(zero_stage=1),
        ace3.TrainingConfig(zero_stage=2, mixed_precision=True),
        ace3.TrainingConfig(zero_stage=3, cpu_offload=True),
        ace3.TrainingConfig(cpu_offload=True, offload_optimizer=True, offload_parameters=True),
    ]
    for config in configs:
        assert _refused(config) == set(), config


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        (dict(zero_stage=3, mixed_precision=True, amp_level="O2"), {"amp_level"}),
        (
            dict(cpu_offload=True, offload_optimizer=True, optimizer="adam8bit"),
            {"optimizer"},
        ),
    ],
)
def test_settings_the_engine_lacks_are_refused_with_a_reason(
    config: dict, refused: set[str]
) -> None:
    problems = unsupported_settings(ace3.TrainingConfig(**config))
    assert {problem.field for problem in problems} == refused
    assert all("not implemented" in p.reason or "only" in p.reason for p in problems)


def test_multi_node_snippet_is_accepted() -> None:
    config = ace3.DistributedConfig(
        num_gpus=4,
        num_nodes=4,
        node_rank=0,
        master_addr="192.168.1.100",
        master_port=29500,
        backend="nccl",
    ).to_training_config()
    assert _refused(config) == set()
    zero = config.model_copy(update={"zero_stage": 3})
    assert _refused(zero) == set(), "other nodes' shards reach rank 0 over the process group"
    background = zero.model_copy(update={"async_save": True})
    assert _refused(background) == {"async_save"}  # not in the background, with its reason


def test_troubleshooting_assignments_are_validated() -> None:
    config = ace3.TrainingConfig()
    config.batch_size = 16
    config.gradient_checkpointing = True
    config.cpu_offload = True
    config.mixed_precision = True
    config.num_gpus = 4
    config.max_grad_norm = 1.0
    config.learning_rate = 1e-5
    config.weight_decay = 0.01
    config.dropout = 0.1
    assert config.batch_size == 16 and config.dropout == 0.1
    with pytest.raises(pydantic.ValidationError, match="learning_rate"):
        config.learning_rate = -1.0
    with pytest.raises(pydantic.ValidationError, match=r"batch_size \(18\) must be divisible"):
        config.batch_size = 18
    assert config.batch_size == 16, "a refused assignment leaves the old value"
    with pytest.raises(pydantic.ValidationError, match=r"batch_size \(16\) must be divisible"):
        config.num_gpus = 3
    assert config.num_gpus == 4


def test_unknown_fields_are_errors_not_ignored() -> None:
    with pytest.raises(pydantic.ValidationError, match="leraning_rate"):
        ace3.TrainingConfig(leraning_rate=0.1)


def test_the_global_batch_must_split_evenly() -> None:
    with pytest.raises(pydantic.ValidationError, match="num_gpus \\* num_nodes = 4"):
        ace3.TrainingConfig(num_gpus=4, batch_size=30)
    assert ace3.TrainingConfig(num_gpus=4, batch_size=32).world_size == 4
