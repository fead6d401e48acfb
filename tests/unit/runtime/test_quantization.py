"""``quantization``: the int8 artifact loads without pickled code (a safetensors file) into a
freshly built model, is at most 30% of the float model's size, gives the validation metrics
the summary reports, and the summary has the accuracy delta; static calibration; refusals."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import ace3
from ace3.runtime.techniques.quantization import ARTIFACT, quantize_linear
from ace3.training.quantized import save_quantized_model

pytest.importorskip("torchao", reason="the quantization extra (torchao) is not installed")


@pytest.fixture(scope="module")
def digits() -> tuple[TensorDataset, TensorDataset]:
    data = load_digits()
    inputs = torch.tensor(data.data / 16.0, dtype=torch.float32)
    targets = torch.tensor(data.target, dtype=torch.int64)
    return TensorDataset(inputs[:1400], targets[:1400]), TensorDataset(
        inputs[1400:], targets[1400:]
    )


def mlp() -> nn.Sequential:
    """The digits demo's model: mostly Linear weights."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10))  # fmt: skip


def train(digits: Any, tmp_path: Path, **quantization: Any) -> dict[str, Any]:
    config = ace3.TrainingConfig(
        epochs=2, batch_size=64, learning_rate=1e-2, seed=0, log_interval=10,
        quantization=ace3.QuantizationConfig(**quantization),
    )  # fmt: skip
    saving = ace3.CheckpointConfig(save_dir=str(tmp_path / "checkpoints"))
    result = ace3.Trainer(config, checkpoint_config=saving).train(
        mlp(), digits[0], validation_dataset=digits[1]
    )
    return dict(result.final_metrics)


def accuracy(model: nn.Module, data: TensorDataset) -> float:
    inputs, targets = data.tensors
    with torch.no_grad():
        return float((model(inputs).argmax(dim=1) == targets).float().mean())


def header(path: Path) -> dict[str, Any]:
    """A safetensors file's JSON header (8-byte length, then JSON): no pickle anywhere."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return dict(json.loads(raw[8 : 8 + length]))


@pytest.mark.parametrize("method", ["dynamic", "static"])
def test_the_int8_artifact_is_small_loads_without_pickle_and_matches_the_summary(
    digits: Any, tmp_path: Path, method: str
) -> None:
    extra = {"calibration_steps": 4} if method == "static" else {}
    final = train(digits, tmp_path, method=method, **extra)
    artifact = tmp_path / "artifacts" / ARTIFACT
    assert final["quantized_artifact"] == ARTIFACT and artifact.is_file()
    assert final["quantized_size_bytes"] == artifact.stat().st_size
    assert final["float_size_bytes"] == 4 * sum(p.numel() for p in mlp().parameters())
    assert final["quantized_size_bytes"] <= 0.30 * final["float_size_bytes"]
    assert final["quantized_accuracy_delta"] == pytest.approx(
        final["quantized_val_accuracy"] - final["val_accuracy"]
    )
    assert abs(final["quantized_accuracy_delta"]) < 0.05
    described = header(artifact)
    assert described["__metadata__"]["method"] == method
    assert described["0.weight.qdata"]["dtype"] == "I8"
    assert ("0.weight.act_quant_scale" in described) == (method == "static")

    loaded = ace3.load_quantized_model(mlp(), artifact)
    assert type(loaded[0].weight).__name__ == "Int8Tensor"
    assert accuracy(loaded, digits[1]) == pytest.approx(final["quantized_val_accuracy"])


def test_a_model_of_another_shape_is_refused(tmp_path: Path) -> None:
    model = mlp()
    for index in (0, 2):
        quantize_linear(model[index], "dynamic", None)
    save_quantized_model(model, tmp_path / "artifacts" / ARTIFACT, "dynamic")
    other = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 128), nn.ReLU(),
                          nn.Linear(128, 10))  # fmt: skip
    with pytest.raises(ValueError, match=r"layer '0' is \(128, 64\) in the file"):
        ace3.load_quantized_model(other, tmp_path / "artifacts" / ARTIFACT)
    loaded = ace3.load_quantized_model(mlp(), tmp_path / "artifacts" / ARTIFACT)
    assert torch.equal(loaded[4].weight, model[4].weight)  # left in float
    inputs = torch.rand(16, 64)
    assert torch.equal(loaded(inputs), model(inputs))


def test_bad_settings_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(pydantic.ValidationError, match="calibration_steps is for method='static'"):
        ace3.QuantizationConfig(method="dynamic", calibration_steps=10)
    with pytest.raises(pydantic.ValidationError, match="precision"):
        ace3.QuantizationConfig(precision="int4")
    quantization = ace3.QuantizationConfig()
    problems = ace3.unsupported_settings(
        ace3.TrainingConfig(num_gpus=2, tensor_parallel_size=2, quantization=quantization)
    )
    assert [p.field for p in problems] == ["quantization"]
    config = ace3.TrainingConfig(quantization=ace3.QuantizationConfig(target_modules=["x*"]))
    with pytest.raises(ValueError, match=r"quantization.target_modules: the pattern 'x\*'"):
        ace3.Trainer(config).train(mlp(), (torch.zeros(8, 64), torch.zeros(8, dtype=torch.long)))
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)
    with pytest.raises(ImportError, match=r"pip install 'ace3\[quantization\]'"):
        ace3.Trainer(ace3.TrainingConfig(quantization=quantization)).train(
            mlp(), (torch.zeros(8, 64), torch.zeros(8, dtype=torch.long))
        )


def test_a_model_that_is_one_linear_layer_round_trips(tmp_path: Path) -> None:
    """The root module's weight is ``weight``, not ``.weight``."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    inputs = torch.randn(5, 8)
    quantize_(model, Int8WeightOnlyConfig(version=2))
    expected = model(inputs)
    path = tmp_path / "linear-int8.safetensors"
    save_quantized_model(model, path, "dynamic")
    loaded = ace3.load_quantized_model(nn.Linear(8, 4), path)
    assert torch.equal(loaded(inputs), expected)
