"""DeepSpeed-style config dicts -> TrainingConfig: what is mapped, what is refused (and where)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import ace3
from ace3.config.deepspeed import is_deepspeed_config

# The DeepSpeed ZeRO snippet of the seeds, as written.
SEED_DS_CONFIG = {
    "train_batch_size": 32,
    "gradient_accumulation_steps": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "fp16": {"enabled": True},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
}


def _fields(config: ace3.TrainingConfig) -> dict:
    return config.model_dump(exclude_defaults=True)


def test_the_seed_dict_is_accepted_and_mapped() -> None:
    config = ace3.TrainingConfig.from_deepspeed(SEED_DS_CONFIG)
    assert _fields(config) == {
        "zero_stage": 3,
        "batch_size": 8,  # global micro-batch: 32 = 8 x 4 accumulation x 1 process
        "gradient_accumulation_steps": 4,
        "learning_rate": 1e-4,
        "mixed_precision": True,
        "amp_dtype": "float16",
        "loss_scale_window": 1000,  # DeepSpeed's default under fp16
        "offload_optimizer": True,
    }
    assert config.optimizer == "adamw" and config.loss_scaling == "dynamic"
    assert config.init_loss_scale == 2.0**16 and config.effective_zero_stage == 3


@pytest.mark.parametrize(
    ("batch_keys", "num_gpus", "expected"),
    [
        ({"train_batch_size": 64}, 1, (64, 1)),
        ({"train_batch_size": 64}, 4, (64, 1)),
        ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 4, (32, 2)),
        ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8}, 4, (32, 2)),
        ({"train_micro_batch_size_per_gpu": 8}, 4, (32, 1)),
        ({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 3}, 2, (16, 3)),
        (
            {
                "train_batch_size": 48,
                "train_micro_batch_size_per_gpu": 8,
                "gradient_accumulation_steps": 3,
            },
            2,
            (16, 3),
        ),
    ],
)
def test_batch_sizes_follow_deepspeeds_rule(batch_keys, num_gpus, expected) -> None:
    """train = micro per GPU x accumulation x processes; ACE3's batch_size is micro x
    processes (the global micro-batch)."""
    config = ace3.TrainingConfig.from_deepspeed(batch_keys, num_gpus=num_gpus)
    assert (config.batch_size, config.gradient_accumulation_steps) == expected
    assert config.num_gpus == num_gpus


@pytest.mark.parametrize(
    ("batch_keys", "message"),
    [
        (
            {
                "train_batch_size": 50,
                "train_micro_batch_size_per_gpu": 8,
                "gradient_accumulation_steps": 3,
            },
            "must equal",
        ),
        ({"train_batch_size": 30, "gradient_accumulation_steps": 4}, "not divisible"),
        ({"gradient_accumulation_steps": 4, "zero_optimization": {}}, "needs train_batch_size"),
        ({"train_batch_size": "32"}, "train_batch_size: expected an integer"),
    ],
)
def test_inconsistent_batch_sizes_are_value_errors(batch_keys, message) -> None:
    with pytest.raises(ValueError, match=message):
        ace3.TrainingConfig.from_deepspeed(batch_keys)


def test_precision_optimizer_and_clipping_are_mapped() -> None:
    config = ace3.TrainingConfig.from_deepspeed(
        {
            "train_batch_size": 16,
            "gradient_clipping": 1.0,
            "steps_per_print": 5,
            "fp16": {
                "enabled": True,
                "loss_scale": 128,
                "initial_scale_power": 12,
                "loss_scale_window": 50,
                "min_loss_scale": 0.5,
                "hysteresis": 1,
                "auto_cast": False,
            },
            "optimizer": {
                "type": "Adam",
                "params": {
                    "lr": 3e-4,
                    "betas": [0.8, 0.95],
                    "eps": 1e-6,
                    "weight_decay": 0.01,
                    "adam_w_mode": False,
                    "torch_adam": True,
                },
            },
            "wall_clock_breakdown": False,
        }
    )
    assert (config.max_grad_norm, config.log_interval) == (1.0, 5)
    assert config.loss_scaling == 128.0 and config.init_loss_scale == 2.0**12
    assert (config.loss_scale_window, config.min_loss_scale) == (50, 0.5)
    assert config.optimizer == "adam"  # adam_w_mode false: L2 weight decay
    assert (config.learning_rate, config.betas, config.eps, config.weight_decay) == (
        3e-4, (0.8, 0.95), 1e-6, 0.01,
    )  # fmt: skip
    assert (
        ace3.TrainingConfig.from_deepspeed(
            {"gradient_clipping": 0, "train_batch_size": 8}
        ).max_grad_norm
        is None
    )
    bf16 = ace3.TrainingConfig.from_deepspeed({"train_batch_size": 8, "bf16": {"enabled": True}})
    assert (bf16.mixed_precision, bf16.amp_dtype, bf16.amp_level) == (True, "bfloat16", "O1")
    off = ace3.TrainingConfig.from_deepspeed({"train_batch_size": 8, "fp16": {"enabled": False}})
    assert off.mixed_precision is False
    apex = ace3.TrainingConfig.from_deepspeed(
        {"train_batch_size": 8, "amp": {"enabled": True, "opt_level": "O2"}}
    )
    assert (apex.amp_level, apex.amp_dtype) == ("O2", "float16")
    sgd = ace3.TrainingConfig.from_deepspeed(
        {"train_batch_size": 8, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    )
    assert (sgd.optimizer, sgd.momentum) == ("sgd", 0.0)  # torch's SGD default, not ACE3's 0.9


def test_offload_devices_map_to_the_offload_fields() -> None:
    config = ace3.TrainingConfig.from_deepspeed(
        {
            "train_batch_size": 8,
            "zero_optimization": {
                "stage": 3,
                "offload_optimizer": {"device": "cpu", "pin_memory": True},
                "offload_param": {"device": "cpu"},
            },
        }
    )
    assert (config.offload_optimizer, config.offload_parameters) == (True, True)
    none = ace3.TrainingConfig.from_deepspeed(
        {
            "train_batch_size": 8,
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}},
        }
    )
    assert (none.zero_stage, none.offload) == (2, False)


def test_every_key_that_cannot_be_honoured_is_refused_with_its_path() -> None:
    ds = {
        "train_batch_size": 32,
        "fp16": {"enabled": True, "hysteresis": 2, "loss_scale_window": "auto"},
        "zero_optimization": {
            "stage": 1,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "offload_optimizer": {"device": "cpu", "buffer_count": 4},
            "offload_param": {"device": "nvme"},
        },
        "optimizer": {"type": "Lamb", "params": {"lr": 1e-3}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
        "activation_checkpointing": {"partition_activations": True},
        "wall_clock_breakdown": True,
    }
    with pytest.raises(ace3.UnsupportedFeatureError) as caught:
        ace3.TrainingConfig.from_deepspeed(ds)
    fields = [problem.field for problem in caught.value.problems]
    assert sorted(fields) == sorted(
        [
            "fp16.loss_scale_window",
            "fp16.hysteresis",
            "zero_optimization.overlap_comm",
            "zero_optimization.contiguous_gradients",
            "zero_optimization.offload_optimizer.buffer_count",
            "zero_optimization.offload_optimizer.device",  # stage 1 cannot offload
            "zero_optimization.offload_param.device",  # nvme
            "optimizer.type",
            "scheduler.type",
            "activation_checkpointing",
            "wall_clock_breakdown",
        ]
    )
    message = str(caught.value)
    for field in fields:
        assert field in message
    assert "'auto' is filled in" in message and "WarmupLR" in message
    assert isinstance(caught.value, ValueError)


def test_both_precisions_and_clashing_keyword_fields_are_refused() -> None:
    with pytest.raises(ace3.UnsupportedFeatureError, match="fp16 and bf16 are both enabled"):
        ace3.TrainingConfig.from_deepspeed(
            {"train_batch_size": 8, "fp16": {"enabled": True}, "bf16": {"enabled": True}}
        )
    with pytest.raises(ValueError, match="batch_size is set by the DeepSpeed config"):
        ace3.TrainingConfig.from_deepspeed({"train_batch_size": 8}, batch_size=16)
    with pytest.raises(ace3.UnsupportedFeatureError, match="stage 3 only"):
        ace3.TrainingConfig.from_deepspeed(
            {
                "train_batch_size": 8,
                "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}},
            }
        )
    with pytest.raises(ValueError, match=r"zero_optimization\.stage: expected 0-3"):
        ace3.TrainingConfig.from_deepspeed({"zero_optimization": {"stage": 4}})
    with pytest.raises(TypeError, match="ds_config must be a dict"):
        ace3.TrainingConfig.from_deepspeed([("train_batch_size", 8)])  # type: ignore[arg-type]


def test_keyword_fields_fill_what_the_dict_lacks() -> None:
    config = ace3.TrainingConfig.from_deepspeed(
        SEED_DS_CONFIG,
        num_gpus=2,
        epochs=5,
        lr_scheduler={"name": "warmup", "params": {"warmup_steps": 3}},
    )
    # 32 = micro 4 per GPU x 4 accumulation x 2 processes: the global micro-batch is 8
    assert (config.num_gpus, config.epochs, config.batch_size) == (2, 5, 8)
    assert config.lr_scheduler is not None and config.lr_scheduler.name == "warmup"


def test_trainers_accept_a_deepspeed_dict() -> None:
    assert is_deepspeed_config(SEED_DS_CONFIG)
    assert not is_deepspeed_config({"batch_size": 32, "optimizer": "adamw"})
    trainer = ace3.Trainer(config=SEED_DS_CONFIG)
    assert trainer.config == ace3.TrainingConfig.from_deepspeed(SEED_DS_CONFIG)
    data_parallel = ace3.DataParallelTrainer(SEED_DS_CONFIG)
    assert data_parallel.config.parallelism == "data" and data_parallel.config.zero_stage == 3
    with pytest.raises(ace3.UnsupportedFeatureError, match=r"zero_optimization\.overlap_comm"):
        ace3.Trainer(
            config={**SEED_DS_CONFIG, "zero_optimization": {"stage": 2, "overlap_comm": False}}
        )


def test_the_mapping_does_not_import_torch() -> None:
    code = (
        "import sys, ace3; ace3.TrainingConfig.from_deepspeed({'train_batch_size': 8}); "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
