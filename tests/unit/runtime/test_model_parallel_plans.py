"""Stage splitting, the automatic tensor-parallel plan, and model/pipeline config checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ace3
from ace3.config import pipeline_layout, unsupported_settings
from ace3.runtime.parallel.dims import ParallelDims
from ace3.runtime.parallel.pipeline_schedule import pad_to, per_sample_loss
from ace3.runtime.parallel.stage_split import (
    balanced_split_points,
    pipeline_stages,
    split_sequential,
)
from ace3.runtime.parallel.tensor_plan import linear_pairs


def mlp() -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10),
    )  # fmt: skip


def test_balanced_split_minimises_the_largest_stage() -> None:
    assert balanced_split_points([10, 0, 10, 0, 10, 0, 10], 2) == [4]
    assert balanced_split_points([10, 0, 10, 0, 10, 0, 10], 4) == [2, 4, 6]
    assert balanced_split_points([100, 0, 1, 1, 1], 2) == [2]
    # Stages start at layers with parameters: the activation stays with its Linear.
    assert balanced_split_points([0, 5, 0, 5], 2) == [3]


def test_too_few_parameter_layers_for_the_stages_is_an_error() -> None:
    with pytest.raises(ValueError, match="fewer than num_stages=3"):
        balanced_split_points([5, 0, 5], 3)


def test_split_sequential_keeps_the_layer_names_and_the_layers() -> None:
    model = mlp()
    stages = split_sequential(model, 2)
    assert [list(dict(s.named_children())) for s in stages] == [
        ["0", "1"],
        ["2", "3", "4", "5", "6"],
    ]
    assert stages[1][0] is model[2]  # shared, not copied
    assert set(stages[1].state_dict()) == {"2.weight", "2.bias", "4.weight", "4.bias",
                                           "6.weight", "6.bias"}  # fmt: skip
    x = torch.randn(3, 64)
    assert torch.equal(stages[1](stages[0](x)), model(x))


def test_user_split_points_win_and_are_checked() -> None:
    stages = split_sequential(mlp(), 2, [4])
    assert list(dict(stages[1].named_children())) == ["4", "5", "6"]
    with pytest.raises(ValueError, match="increasing layer indices"):
        split_sequential(mlp(), 3, [4, 2])


def test_a_model_that_is_not_sequential_needs_pipeline_stages() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    with pytest.raises(TypeError, match="define pipeline_stages"):
        pipeline_stages(Net(), 2, None)

    class UserModule:
        @staticmethod
        def pipeline_stages(model: Net, num_stages: int) -> list[nn.Module]:
            return [model.a, model.b]

    net = Net()
    assert pipeline_stages(net, 2, None, UserModule) == [net.a, net.b]


def test_automatic_tensor_plan_pairs_linears_through_elementwise_layers() -> None:
    assert linear_pairs(mlp(), 2) == [("0", "2"), ("4", "6")]
    assert linear_pairs(mlp(), 4) == [("0", "2"), ("4", "6")]
    # A hidden width that does not divide is left whole; the next pair is tried.
    assert linear_pairs(mlp(), 3) == []
    nested = nn.Sequential(nn.Flatten(), nn.Sequential(nn.Linear(8, 6), nn.GELU(),
                                                       nn.Dropout(0.1), nn.Linear(6, 2)))  # fmt: skip
    assert linear_pairs(nested, 2) == [("1.0", "1.3")]
    assert linear_pairs(nn.Sequential(nn.Linear(8, 6), nn.LayerNorm(6), nn.Linear(6, 2)), 2) == []


def test_per_sample_loss_matches_the_default_losses() -> None:
    logits, labels = torch.randn(5, 3), torch.tensor([0, 2, 1, 1, 0])
    assert per_sample_loss(logits, labels).mean() == pytest.approx(
        float(nn.functional.cross_entropy(logits, labels))
    )
    out, target = torch.randn(4, 2), torch.randn(4, 2)
    assert per_sample_loss(out, target).mean() == pytest.approx(
        float(nn.functional.mse_loss(out, target))
    )
    assert pad_to(torch.arange(3), 5).tolist() == [0, 1, 2, 0, 0]


def test_the_document_snippets_are_accepted() -> None:
    model = ace3.TrainingConfig(parallelism="model", num_gpus=4, model_sharding_strategy="layer")
    pipeline = ace3.TrainingConfig(
        parallelism="pipeline", num_stages=4, micro_batch_size=8, gradient_accumulation_steps=16
    )
    assert unsupported_settings(model) == [] and unsupported_settings(pipeline) == []
    assert pipeline.world_size == 4  # one process per stage when num_gpus is not given
    assert pipeline_layout(pipeline) == (4, 4, "1f1b")
    assert pipeline_layout(model) == (4, 1, "gpipe")
    tensor = ace3.TrainingConfig(
        parallelism="model", num_gpus=3, model_sharding_strategy="tensor", batch_size=32
    )  # the batch is not split over the processes: 32 need not divide by 3
    assert unsupported_settings(tensor) == [] and pipeline_layout(tensor) is None


@pytest.mark.parametrize(
    ("fields", "refused", "words"),
    [
        (dict(parallelism="model", num_gpus=2), {"model_sharding_strategy"}, "needs one of"),
        (dict(num_stages=2), {"num_stages"}, "only used with parallelism"),
        (dict(parallelism="pipeline", num_stages=4, micro_batch_size=16), {"micro_batch_size"},
         "1f1b schedule needs"),
        (dict(parallelism="pipeline", num_stages=2, micro_batch_size=5), {"micro_batch_size"},
         "multiple of the micro-batch"),
        (dict(parallelism="pipeline", num_stages=3, num_gpus=4), {"num_stages"},
         "must divide the 4 processes"),
        (dict(num_gpus=4, tensor_parallel_size=3), {"tensor_parallel_size"},
         "must divide the 4 processes"),
        (dict(parallelism="pipeline", num_gpus=4, pipeline_parallel_size=2, num_stages=4),
         {"pipeline_parallel_size"},
         "its alias"),
        (dict(num_gpus=8, pipeline_parallel_size=2, tensor_parallel_size=2,
              data_parallel_size=4), {"data_parallel_size"}, "is 2 data-parallel replica(s)"),
        (dict(num_gpus=4, data_parallel_size=2), {"data_parallel_size"}, "set num_gpus"),
        (dict(num_gpus=4, tensor_parallel_size=2, zero_stage=1), {"zero_stage"},
         "ZeRO-1 with tensor parallelism is not implemented"),
        (dict(num_gpus=2, tensor_parallel_size=2, zero_stage=3), {"zero_stage"},
         "has one (2 processes = pipeline 1 x tensor 2)"),
        (dict(num_gpus=4, tensor_parallel_size=2, micro_batch_size=8),
         {"micro_batch_size"}, "pipeline_parallel_size > 1"),
        (dict(num_gpus=4, pipeline_parallel_size=2, batch_size=64, micro_batch_size=32),
         {"micro_batch_size"}, "1f1b schedule needs"),
        (dict(parallelism="pipeline", num_stages=2, zero_stage=2), {"zero_stage"}, "ZeRO"),
        (dict(parallelism="pipeline", num_stages=3, batch_size=48,
              pipeline_split_points=[2]),
         {"pipeline_split_points"}, "increasing layer indices"),
        (dict(parallelism="pipeline", num_stages=2, mixed_precision=True, amp_dtype="float16"),
         {"amp_dtype"}, "bfloat16"),
        (dict(parallelism="model", model_sharding_strategy="layer", num_gpus=2,
              micro_batch_size=4), {"micro_batch_size"}, "one micro-batch"),
        (dict(parallelism="model", model_sharding_strategy="tensor", num_gpus=2,
              optimizer="adam8bit"), {"optimizer"}, "DTensor"),
        (dict(parallelism="model", model_sharding_strategy="tensor", num_gpus=2,
              gradient_checkpointing=True), {"gradient_checkpointing"}, "turn it off"),
    ],
)  # fmt: skip
def test_misfitting_settings_are_refused_with_a_reason(
    fields: dict, refused: set[str], words: str
) -> None:
    problems = unsupported_settings(ace3.TrainingConfig(**fields))
    assert {p.field for p in problems} == refused
    assert any(words in p.reason for p in problems), [p.reason for p in problems]


@pytest.mark.parametrize(
    ("fields", "world", "degrees"),
    [
        (dict(num_gpus=8), 8, (8, 1, 1)),
        (dict(num_gpus=8, tensor_parallel_size=2), 8, (4, 1, 2)),
        (dict(num_gpus=8, pipeline_parallel_size=2, batch_size=64), 8, (4, 2, 1)),
        (dict(num_gpus=8, pipeline_parallel_size=2, tensor_parallel_size=2), 8, (2, 2, 2)),
        (dict(num_gpus=8, data_parallel_size=2, pipeline_parallel_size=2,
              tensor_parallel_size=2), 8, (2, 2, 2)),
        (dict(num_gpus=4, tensor_parallel_size=2, zero_stage=3), 4, (2, 1, 2)),
        (dict(num_gpus=4, pipeline_parallel_size=2, zero_stage=2, batch_size=64), 4, (2, 2, 1)),
        (dict(parallelism="pipeline", num_stages=2, num_gpus=4), 4, (2, 2, 1)),
        (dict(parallelism="pipeline", num_stages=4), 4, (1, 4, 1)),
        (dict(parallelism="model", model_sharding_strategy="tensor", num_gpus=4), 4, (1, 1, 4)),
        (dict(parallelism="model", model_sharding_strategy="layer", num_gpus=3), 3, (1, 3, 1)),
        (dict(parallelism="model", model_sharding_strategy="tensor", num_gpus=4,
              pipeline_parallel_size=2), 4, (1, 2, 2)),
    ],
)  # fmt: skip
def test_the_layout_degrees_multiply_to_the_processes(
    fields: dict, world: int, degrees: tuple[int, int, int]
) -> None:
    config = ace3.TrainingConfig(**fields)
    assert unsupported_settings(config) == []
    dims = ParallelDims.for_job(config, world, rank=0)
    assert (dims.dp, dims.pp, dims.tp) == degrees and dims.world_size == world


def test_ranks_are_laid_out_tensor_innermost_then_stages_then_replicas() -> None:
    coords = []
    for rank in range(8):
        dims = ParallelDims(dp=2, pp=2, tp=2, rank=rank)
        coords.append((dims.dp_rank, dims.pp_rank, dims.tp_rank))
        assert dims.global_rank(*coords[-1]) == rank
        assert dims.replica == (dims.dp_rank, 2)
        assert dims.counts_samples == (dims.pp_rank == 0 and dims.tp_rank == 0)
    assert coords[:4] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert coords[4] == (1, 0, 0)


def test_a_pipeline_replica_splits_its_share_of_the_batch_into_micro_batches() -> None:
    config = ace3.TrainingConfig(num_gpus=4, pipeline_parallel_size=2, batch_size=64,
                                 micro_batch_size=8)  # fmt: skip
    assert pipeline_layout(config) == (2, 4, "1f1b")  # 2 replicas x 32 samples = 4 x 8
    with pytest.raises(ValueError, match="divisible by the 2 data-parallel replicas"):
        ace3.TrainingConfig(num_gpus=4, tensor_parallel_size=2, batch_size=63)
