"""``communication_data_type`` and ``ddp_bucket_cap_mb``: the config (and its DeepSpeed
mapping, seed 002's dict among them) and what the engine sets up, on one in-process rank (the
2-rank runs: tests/integration/runtime/test_runtime_recipes.py reduces bf16 over gloo; the
effect on the curve: benchmarks/communication_dtype.py)."""

from __future__ import annotations

import pydantic
import pytest
import torch
from torch import nn

import ace3
from ace3.config import TrainingConfig, unsupported_settings
from ace3.errors import UnsupportedFeatureError
from ace3.runtime.parallel.base import average_over
from ace3.runtime.parallel.ddp import wrap_ddp
from ace3.runtime.parallel.sharding import shard_model, sharding_plan
from ace3.runtime.process.distributed import destroy_distributed, init_distributed

SEED_002 = {
    "communication_data_type": "fp16",
    "allgather_base_size": 1000000,
    "reduce_scatter_base_size": 1000000,
}


def test_seed_002s_communication_dict_is_taken_as_deepspeed_settings() -> None:
    config = ace3.Trainer(config=SEED_002).config
    assert config.communication_data_type == "fp16"
    assert config.ddp_bucket_cap_mb == pytest.approx(1e6 * 4 / 2**20)  # float32 gradients
    assert config.zero_stage == 0  # (nothing is all-gathered: allgather_base_size accepted)
    with pytest.raises(UnsupportedFeatureError) as caught:
        TrainingConfig.from_deepspeed({**SEED_002, "zero_optimization": {"stage": 3}})
    fields = {p.field: p.reason for p in caught.value.problems}
    assert set(fields) == {"allgather_base_size", "reduce_scatter_base_size"}
    assert "no bucket to size" in fields["reduce_scatter_base_size"]
    assert "has no meaning here" in fields["allgather_base_size"]
    with pytest.raises(UnsupportedFeatureError, match="allgather_base_size"):
        TrainingConfig.from_deepspeed({**SEED_002, "zero_optimization": {"stage": 1}})
    with pytest.raises(ValueError, match="communication_data_type: expected"):
        TrainingConfig.from_deepspeed({"train_batch_size": 32, "communication_data_type": "int8"})


def test_the_config_fields_and_the_layouts_they_need() -> None:
    with pytest.raises(pydantic.ValidationError, match="communication_data_type"):
        TrainingConfig(communication_data_type="int8")
    assert unsupported_settings(TrainingConfig(communication_data_type="bf16", zero_stage=3)) == []
    [problem] = unsupported_settings(TrainingConfig(ddp_bucket_cap_mb=4.0, zero_stage=2))
    assert problem.field == "ddp_bucket_cap_mb" and "FSDP" in problem.reason
    [problem] = unsupported_settings(
        TrainingConfig(communication_data_type="fp32", mixed_precision=True, amp_level="O2")
    )
    assert problem.field == "communication_data_type"


def test_the_engines_own_reduction_casts_like_ddps_hook() -> None:
    config = TrainingConfig(batch_size=4)
    init_distributed(config)
    try:
        grads = [torch.tensor([1.0 + 2**-12, 3.0]), torch.tensor([0.1])]
        expected = [g.to(torch.float16).float() for g in grads]
        average_over(grads, 1, dtype=torch.float16)
        assert all(torch.equal(g, e) for g, e in zip(grads, expected, strict=True))
    finally:
        destroy_distributed()


def test_ddp_reduces_in_fp16_with_the_bucket_size_and_fsdp_in_bf16() -> None:
    config = TrainingConfig(batch_size=4, communication_data_type="fp16", ddp_bucket_cap_mb=1.0)
    ctx = init_distributed(config)
    try:
        model = nn.Linear(3, 1)
        ddp = wrap_ddp(model, ctx, config=config)
        assert ddp.bucket_bytes_cap == 1 << 20
        ddp(torch.tensor([[1.0 + 2**-12, 0.1, 3.0]])).sum().backward()  # the hook runs
        assert model.weight.grad is not None
        rounded = model.weight.grad.to(torch.float16).float()
        assert torch.equal(model.weight.grad, rounded)
        assert not torch.equal(
            torch.tensor([1.0 + 2**-12]).half().float(), torch.tensor([1.0 + 2**-12])
        )
        bf16 = TrainingConfig(batch_size=4, communication_data_type="bf16")
        other = nn.Linear(3, 1)  # (gloo: torch's own bf16 hook would be refused by DDP)
        other_ddp = wrap_ddp(other, ctx, config=bf16)  # (held: its reducer runs the hook)
        other_ddp(torch.tensor([[1.0 + 2**-9, 0.1, 3.0]])).sum().backward()
        assert other.weight.grad is not None
        assert torch.equal(other.weight.grad, other.weight.grad.bfloat16().float())
        assert other.weight.grad[0, 0] == 1.0  # (2**-9 is below bfloat16's 8 bits)
        sharded = TrainingConfig(batch_size=4, zero_stage=3, communication_data_type="bf16")
        module = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        shard_model(module, sharding_plan(sharded, ctx.device), ctx)
        policy = module._get_fsdp_state()._mp_policy  # type: ignore[operator]
        assert (policy.reduce_dtype, policy.param_dtype) == (torch.bfloat16, None)
    finally:
        destroy_distributed()
