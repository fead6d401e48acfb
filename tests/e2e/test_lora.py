"""LoRA through the real stack (API, Postgres, Redis, Celery worker, torchrun with 2 gloo ranks,
DDP and ZeRO-1): the checkpoint holds the adapters alone (at most 10% of the model), the merged model is
an artifact under the original names whose outputs are base + adapters', and the summary
counts trainable and total parameters."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import ace3
from tests.conftest import DigitsFiles, load_example

pytestmark = pytest.mark.slow

HIDDEN = 1024  # the digits MLP, wide enough that its adapters are a small share of it
ADAPTED = ("0", "3")  # its first two Linear layers


@pytest.mark.parametrize("zero_stage", [0, 1], ids=["ddp", "zero1"])
def test_a_remote_lora_job_checkpoints_the_adapters_and_delivers_the_merged_model(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path, zero_stage: int
) -> None:
    import numpy as np
    import torch
    from safetensors.torch import load_file

    lora = ace3.LoRAConfig(r=4, lora_alpha=8, target_modules=list(ADAPTED))
    config = ace3.TrainingConfig(
        num_gpus=2,
        batch_size=64,
        learning_rate=3e-3,
        seed=0,
        epochs=1,
        zero_stage=zero_stage,
        lora=lora,
    )
    result = ace3.DistributedTrainer(config).train(
        model=client.load_model(digits_files.model),
        train_dataset=client.load_dataset(digits_files.train),
        model_kwargs={"hidden": HIDDEN},
    )
    torch.manual_seed(config.seed)  # what the engine does before it calls build_model
    model = load_example("model").build_model(hidden=HIDDEN)
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    total = sum(v.numel() for v in initial.values())
    adapters = 4 * (64 + HIDDEN) + 4 * (HIDDEN + HIDDEN)
    assert result.final_metrics["trainable_parameters"] == adapters
    assert result.final_metrics["total_parameters"] == total + adapters

    final = client.jobs.checkpoints(result.job_id)[-1]
    client.jobs.download_checkpoint(result.job_id, final, tmp_path)
    if zero_stage == 0:  # the plain format, weights only
        checkpoint = torch.load(tmp_path / final.name, weights_only=True)
    else:  # ZeRO-1 writes sharded checkpoints (step-*.dcp.tar)
        checkpoint = ace3.load_checkpoint(tmp_path / final.name)
    assert {k for k in checkpoint["model"] if ".lora_" in k} == {
        f"{layer}.lora_{ab}.default.weight" for layer in ADAPTED for ab in "AB"
    }
    assert len(checkpoint["model"]) == 5  # and the base's fingerprint
    buffer = io.BytesIO()
    torch.save(initial, buffer)
    assert final.size_bytes <= 0.10 * len(buffer.getvalue())

    merged_path = client.jobs.download_artifact(result.job_id, "merged_model.safetensors", tmp_path)
    merged = load_file(merged_path)
    assert set(merged) == set(initial)  # the original module names
    for name, value in merged.items():
        if name.split(".")[0] not in ADAPTED or name.endswith("bias"):
            assert torch.equal(value, initial[name]), name  # every base tensor as built
    weights = checkpoint["model"]
    for layer in ADAPTED:
        a, b = (weights[f"{layer}.lora_{ab}.default.weight"] for ab in "AB")
        assert b.abs().max() > 0, "the adapters did not train"
        expected = initial[f"{layer}.weight"] + (lora.lora_alpha / lora.r) * b @ a
        torch.testing.assert_close(merged[f"{layer}.weight"], expected, rtol=1e-5, atol=1e-6)

    # the merged model computes what the base with its adapters computes
    inputs = torch.from_numpy(np.load(digits_files.train)["inputs"][:64]).float()
    model.eval()
    with torch.no_grad():
        hidden = inputs
        for index, module in enumerate(model):
            out = module(hidden)
            if str(index) in ADAPTED:
                a, b = (weights[f"{index}.lora_{ab}.default.weight"] for ab in "AB")
                out = out + (lora.lora_alpha / lora.r) * (hidden @ a.T) @ b.T
            hidden = out
        model.load_state_dict(merged)
        torch.testing.assert_close(model(inputs), hidden, rtol=1e-4, atol=1e-5)

    lines = [line.line for line in client.jobs.logs(result.job_id, limit=5000).data]
    assert any(
        line.startswith("LoRA r=4 alpha=8 dropout=0 bias=none on 2 layer(s)") for line in lines
    )
