"""Compression through the real stack (API, Postgres, Redis, Celery worker, torchrun with 2 gloo
ranks): one digits job prunes while it trains and quantizes to int8 after it. The final
global sparsity is within 1 point of the target, the final checkpoint holds plain weights with
those zeros, the int8 artifact loads without pickled code into the model file's fresh model,
is at most 30% of the float model's size and gives the accuracy the summary reports, and the
summary has the accuracy drop of pruning and the accuracy delta of the int8 model."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import ace3
from tests.conftest import DigitsFiles, load_example

pytestmark = pytest.mark.slow


def test_a_remote_job_prunes_and_writes_an_int8_model(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    import torch

    config = ace3.TrainingConfig(
        num_gpus=2, batch_size=64, learning_rate=3e-3, seed=0, log_interval=5,
        pruning=ace3.PruningConfig(target_sparsity=0.5, schedule="cubic", begin_step=10,
                                   frequency=5),
        quantization=ace3.QuantizationConfig(method="static", calibration_steps=4),
    )  # fmt: skip
    result = ace3.DistributedTrainer(config).train(
        model=client.load_model(digits_files.model),
        train_dataset=client.load_dataset(digits_files.train),
        validation_dataset=client.load_dataset(digits_files.validation),
        epochs=2,
    )
    final = result.final_metrics
    assert abs(final["sparsity"] - 0.5) <= 0.01
    assert final["pruning_accuracy_drop"] == pytest.approx(
        final["dense_val_accuracy"] - final["val_accuracy"]
    )
    sparsities = [m.value for m in client.jobs.metrics(result.job_id, name="sparsity")]
    assert len(sparsities) > 2 and sparsities == sorted(sparsities)

    checkpoint = client.jobs.checkpoints(result.job_id)[-1]
    client.jobs.download_checkpoint(result.job_id, checkpoint.id, tmp_path / checkpoint.name)
    weights = torch.load(tmp_path / checkpoint.name, weights_only=True)["model"]
    fresh = load_example("model").build_model()
    assert set(weights) == set(fresh.state_dict())  # plain names, the masks folded in
    pruned = [weights[f"{i}.weight"] for i in (0, 3, 5)]
    zeros = sum(int((w == 0).sum()) for w in pruned) / sum(w.numel() for w in pruned)
    assert abs(zeros - 0.5) <= 0.01

    assert final["quantized_size_bytes"] <= 0.30 * final["float_size_bytes"]
    assert "quantized_accuracy_delta" in final and "quantized_val_accuracy" in final
    artifact = client.jobs.download_artifact(
        result.job_id, final["quantized_artifact"], tmp_path / "int8.safetensors"
    )
    raw = artifact.read_bytes()
    assert len(raw) == final["quantized_size_bytes"]
    (length,) = struct.unpack("<Q", raw[:8])  # safetensors: a JSON header, then raw tensors
    assert json.loads(raw[8 : 8 + length])["__metadata__"]["format"] == "ace3-int8"
    model = ace3.load_quantized_model(fresh, artifact)
    validation = np.load(digits_files.validation)
    with torch.no_grad():
        logits = model(torch.from_numpy(validation["inputs"]))
    hits = (logits.argmax(dim=1).numpy() == validation["targets"]).mean()
    assert hits == pytest.approx(final["quantized_val_accuracy"])
