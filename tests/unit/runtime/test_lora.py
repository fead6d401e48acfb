"""``lora``: only the adapters train (every base weight bitwise as it was), checkpoints hold the
adapters alone (a small share of the model) and resume exactly onto a base rebuilt from the
seed, the merged weights compute what base + adapters computed, and what cannot work is
refused by name."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pydantic
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import ace3
from ace3.runtime.in_process import train_in_process
from ace3.runtime.loop.hooks import TrainingHook
from ace3.runtime.loop.precision import resolve_precision
from ace3.runtime.techniques.initial_weights import load_initial_weights, read_weights
from ace3.runtime.techniques.lora import apply_lora
from ace3.runtime.techniques.lora_merge import merged_state_dict

pytest.importorskip("peft")

_inputs = torch.randn(96, 64, generator=torch.Generator().manual_seed(1))
DATA = TensorDataset(_inputs, _inputs[:, :4].sum(dim=1, keepdim=True))
PROBE = _inputs[:16]
LORA = ace3.LoRAConfig(r=4, lora_alpha=8, target_modules=["fc1", "fc2"])
BASE: dict[str, Any] = {
    "batch_size": 16,
    "epochs": 2,
    "validation_split": 0.0,
    "learning_rate": 0.01,
    "seed": 0,
    "lora": LORA,
}


class Net(nn.Module):
    def __init__(self, hidden: int = 512) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


class Watch(TrainingHook):
    """The adapted model's parameters at the start and the end, and its outputs at the end."""

    def on_train_begin(self) -> None:
        self.begin = _params(self.run.model)

    def on_train_end(self, logs: dict[str, float]) -> None:
        self.end = _params(self.run.model)
        self.grad = {n: p.requires_grad for n, p in self.run.model.named_parameters()}
        model = self.run.model
        model.eval()
        with torch.no_grad():
            self.outputs = model(PROBE)
        model.train()


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Whole copies (a ZeRO-3 run's shards gathered while its process group is up)."""
    from torch.distributed.tensor import DTensor

    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for name, p in model.named_parameters()
    }


def _train(tmp_path: Path, model: nn.Module, **fields: Any) -> tuple[Watch, Any]:
    watch = Watch()
    save_dir = tmp_path / "ckpt"
    resume = fields.pop("resume", None)
    run = train_in_process(
        ace3.TrainingConfig(**{**BASE, **fields}), model, DATA,
        hooks=[watch], checkpoint_dir=save_dir, resume_from=resume,
    )  # fmt: skip
    return watch, run


def _file_size(state: dict[str, Any]) -> int:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return len(buffer.getvalue())


def test_only_the_adapters_train_and_the_module_gets_the_merged_weights(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model = _net()
    original = {name: value.clone() for name, value in model.state_dict().items()}
    watch, run = _train(tmp_path, model)

    # every base weight bitwise as the model was built; every adapter tensor moved
    for name, value in watch.end.items():
        plain = name.replace(".base_layer.", ".")
        if ".lora_" in name:
            assert watch.grad[name], name
            assert not torch.equal(value, watch.begin[name]), f"{name} did not train"
        else:
            assert not watch.grad[name], name
            assert torch.equal(value, original[plain]), f"{name} changed"
    assert run.final_metrics["trainable_parameters"] == 4 * (64 + 512) + 4 * (512 + 512)
    assert run.final_metrics["total_parameters"] == sum(v.numel() for v in watch.end.values())
    assert "LoRA r=4 alpha=8 dropout=0 bias=none on 2 layer(s) (fc1, fc2): training 6,400" in (
        capfd.readouterr().out
    )

    # the checkpoint: adapters (and the base's fingerprint) only, optimizer state for them
    checkpoint = torch.load(run.checkpoints[-1], weights_only=True)
    assert set(checkpoint) >= {"model", "optimizer", "scheduler", "rng_per_rank", "step"}
    adapters = {k for k in checkpoint["model"] if ".lora_" in k}
    assert adapters == {
        f"{layer}.lora_{ab}.default.weight" for layer in ("fc1", "fc2") for ab in "AB"
    }
    assert set(checkpoint["model"]) - adapters == {"_ace3_lora_base_sha256"}
    assert len(checkpoint["optimizer"]["state"]) == 4
    assert run.checkpoints[-1].stat().st_size <= 0.10 * _file_size(original)

    # the caller's module: its own layers back, adapters merged, same outputs
    assert [type(m) for m in model.children()] == [nn.Linear, nn.Linear, nn.Linear]
    assert all(p.requires_grad for p in model.parameters())
    assert set(model.state_dict()) == set(original)
    assert torch.equal(model.head.weight, original["head.weight"])
    assert not torch.equal(model.fc1.weight, original["fc1.weight"])
    with torch.no_grad():
        torch.testing.assert_close(model(PROBE), watch.outputs, rtol=1e-5, atol=1e-5)


def test_the_merged_state_computes_what_base_and_adapters_compute() -> None:
    config = ace3.TrainingConfig(
        lora=ace3.LoRAConfig(r=2, lora_alpha=6, target_modules=["fc*"], bias="lora_only")
    )
    model = _net()
    adapters = apply_lora(model, config)
    assert adapters is not None
    with torch.no_grad():  # adapters as if trained (B starts at zero)
        for name, param in model.named_parameters():
            if ".lora_" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
        expected = model(PROBE)
    precision = resolve_precision(config, torch.device("cpu"))
    precision.prepare_model(model)
    merged = merged_state_dict(adapters, precision)
    plain = Net()
    plain.load_state_dict(merged)  # the original module names, nothing more
    with torch.no_grad():
        torch.testing.assert_close(plain(PROBE), expected, rtol=1e-5, atol=1e-5)
    assert all(value.dtype == torch.float32 for value in merged.values())


@pytest.mark.parametrize("zero_stage", [0, 1, 3], ids=["plain", "zero1", "zero3"])
def test_an_adapter_only_checkpoint_resumes_exactly_on_the_rebuilt_base(
    tmp_path: Path, zero_stage: int
) -> None:
    fields = {"save_interval": 6, "zero_stage": zero_stage}  # 12 steps in all
    whole, _ = _train(tmp_path / "whole", _net(), **fields)
    _, first = _train(tmp_path / "cut", _net(), **fields, max_steps=6)
    suffix = ".pt" if zero_stage == 0 else ".dcp.tar"
    assert [path.name for path in first.checkpoints] == [f"step-00000006{suffix}"]
    resumed, _ = _train(tmp_path / "cut", _net(), **fields, resume=first.checkpoints[0])
    for name, value in whole.end.items():
        assert torch.equal(resumed.end[name], value), name

    # adapters onto other base weights: refused with the reason, the module left as it was
    other = _net(seed=1)
    given = {name: value.clone() for name, value in other.state_dict().items()}
    with pytest.raises(ValueError, match="trained on other base weights"):
        _train(tmp_path / "other", other, **fields, resume=first.checkpoints[0])
    assert [type(m) for m in other.children()] == [nn.Linear, nn.Linear, nn.Linear]
    for name, value in other.state_dict().items():
        assert torch.equal(value, given[name]), name


MODEL_FILE = """
from torch import nn


def build_model():
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))
"""


def _sequential(seed: int) -> nn.Module:
    torch.manual_seed(seed)  # (what MODEL_FILE builds after the engine seeded torch)
    return nn.Sequential(
        nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)
    )


def _run_job(
    root: Path,
    name: str,
    resume_from: Path | None = None,
    init_from: Path | None = None,
    **fields: Any,
) -> Path:
    """One attempt of a job as the worker starts it (job spec, model file, data file, the
    weights it starts from), in this process; returns its output directory."""
    from ace3.runtime.build import build
    from ace3.runtime.job_spec import JobSpec
    from ace3.runtime.loop.loop import RunPlace, TrainingLoop
    from ace3.runtime.process.distributed import destroy_distributed, init_distributed

    (root / "model.py").write_text(MODEL_FILE)
    if not (root / "data.npz").exists():
        np.savez(root / "data.npz", X=DATA.tensors[0].numpy(), y=DATA.tensors[1].numpy())
    lora = {"r": 2, "target_modules": ["0", "2"]}
    job = JobSpec.model_validate(
        {
            "job_id": name,
            "config": {**BASE, "lora": lora, "save_interval": 6, **fields},
            "model": {"path": str(root / "model.py"), "kind": "file"},
            "dataset": {"path": str(root / "data.npz")},
            "output_dir": str(root / name),
            "resume_from": str(resume_from) if resume_from else None,
            "init_from": str(init_from) if init_from else None,
        }
    )
    ctx = init_distributed(job.config)
    try:
        parts = build(job, ctx)
        place = RunPlace(name, root / name, root / name / "checkpoints", resumed=bool(resume_from))
        TrainingLoop(place, ctx, parts).run()
    finally:
        destroy_distributed()
    return root / name


@pytest.mark.parametrize(
    ("start", "zero_stage"), [("seed", 0), ("init_from", 0), ("seed", 3)],
    ids=["seed", "init_from", "seed-zero3"],
)  # fmt: skip
def test_a_job_attempt_resumes_its_adapters_on_the_base_it_started_from(
    tmp_path: Path, start: str, zero_stage: int
) -> None:
    """The base of a resumed attempt: the model file's weights from the seed, or init_from's
    (which a resume of a LoRA job loads again: its checkpoint holds the adapters alone). At
    ZeRO-3 the adapted layers are FSDP units of their own (the Sequential's children), and the
    merged model is gathered from the shards."""
    from safetensors.torch import load_file

    built = _sequential(seed=0 if start == "seed" else 7)
    init_from = None
    if start == "init_from":
        init_from = tmp_path / "pretrained.pt"
        torch.save(built.state_dict(), init_from)
    fields = {"init_from": init_from, "zero_stage": zero_stage}
    whole = _run_job(tmp_path, "whole", **fields)
    cut = _run_job(tmp_path, "cut", max_steps=6, **fields)
    first = (
        cut / "checkpoints" / ("step-00000006.pt" if zero_stage == 0 else "step-00000006.dcp.tar")
    )
    resumed = _run_job(tmp_path, "resumed", resume_from=first, **fields)
    if zero_stage == 0:
        last = [torch.load(out / "checkpoints" / "step-00000012.pt", weights_only=True)
                for out in (whole, resumed)]  # fmt: skip
        assert list(last[0]["model"]) == list(last[1]["model"])
        for name, value in last[0]["model"].items():
            assert torch.equal(last[1]["model"][name], value), name
    merged = [load_file(out / "artifacts" / "merged_model.safetensors") for out in (whole, resumed)]
    assert set(merged[0]) == set(built.state_dict())
    for name, value in merged[0].items():
        assert torch.equal(merged[1][name], value), name
        base = built.state_dict()[name]
        assert torch.equal(value, base) == (name not in {"0.weight", "2.weight"}), name
    if zero_stage:
        return

    # a LoRA checkpoint holds no whole model to start another job from: the merged model does
    with pytest.raises(ValueError, match="start from that job's merged model"):
        load_initial_weights(_sequential(0), read_weights(first), first.name)
    load_initial_weights(_sequential(0), merged[1], "merged_model.safetensors")


def test_trainable_parameters_train_fully_next_to_the_adapters(tmp_path: Path) -> None:
    model = _net()
    original = {name: value.clone() for name, value in model.state_dict().items()}
    watch, run = _train(tmp_path, model, trainable=["head"])
    assert not torch.equal(watch.end["head.weight"], original["head.weight"])
    assert torch.equal(watch.end["fc2.base_layer.weight"], original["fc2.weight"])
    checkpoint = torch.load(run.checkpoints[-1], weights_only=True)
    assert {"head.weight", "head.bias"} <= set(checkpoint["model"])
    assert len(checkpoint["optimizer"]["state"]) == 6


@pytest.mark.parametrize("zero_stage", [0, 3], ids=["plain", "zero3"])
def test_lora_composes_with_autocast_and_clipping(tmp_path: Path, zero_stage: int) -> None:
    """bf16 autocast and gradient clipping apply as without LoRA; at ZeRO-3 FSDP shards frozen
    base weights and trainable adapters in the same units, the norm is over the sharded
    adapters' gradients, and the counts are of whole tensors."""
    model = _net()
    original = {name: value.clone() for name, value in model.state_dict().items()}
    fields = {"mixed_precision": True, "amp_dtype": "bfloat16", "max_grad_norm": 0.5}
    watch, run = _train(tmp_path, model, zero_stage=zero_stage, **fields)
    for name, value in watch.end.items():
        if ".lora_" not in name:
            assert torch.equal(value, original[name.replace(".base_layer.", ".")]), name
        else:
            assert not torch.equal(value, watch.begin[name]), f"{name} did not train"
    assert run.final_metrics["trainable_parameters"] == 6400
    assert run.final_metrics["total_parameters"] == sum(v.numel() for v in watch.end.values())
    norms = [value for _, value in run.history["grad_norm"]]
    assert norms and all(0 < norm < 1e3 for norm in norms)


def test_a_target_that_matches_no_layer_is_refused_with_the_module_names() -> None:
    lora = ace3.LoRAConfig(target_modules=["fc1", "attn"])
    with pytest.raises(
        ValueError, match=r"'attn' matches no module .* could adapt: fc1, fc2, head"
    ):
        apply_lora(_net(), ace3.TrainingConfig(lora=lora))
    model = nn.Sequential(nn.Sequential(nn.ReLU()))
    with pytest.raises(ValueError, match=r"matches 0, 0\.0, none of them a layer LoRA adapts"):
        apply_lora(model, ace3.TrainingConfig(lora=ace3.LoRAConfig(target_modules=["0"])))


def test_without_peft_the_build_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # (import peft raises ImportError)
    with pytest.raises(ImportError, match=r"pip install 'ace3\[finetune\]'"):
        apply_lora(_net(), ace3.TrainingConfig(lora=LORA))


@pytest.mark.parametrize(
    "fields",
    [
        {"r": 0},
        {"lora_alpha": 0},
        {"lora_dropout": 1.0},
        {"target_modules": []},
        {"target_modules": [" "]},
        {"bias": "some"},
        {"rank": 8},
    ],
)
def test_invalid_lora_settings_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(pydantic.ValidationError):
        ace3.LoRAConfig(**{"target_modules": ["fc1"], **fields})


def test_settings_lora_cannot_run_with_are_refused_with_the_reason() -> None:
    lora = ace3.LoRAConfig(target_modules=["fc1"])
    refused = {
        problem.field: problem.reason
        for fields in (
            {"freeze": ["head"]},
            {"num_gpus": 2, "pipeline_parallel_size": 2},
            {"num_gpus": 2, "tensor_parallel_size": 2},
        )
        for problem in ace3.unsupported_settings(ace3.TrainingConfig(lora=lora, **fields))
    }
    assert set(refused) >= {"freeze", "pipeline_parallel_size", "tensor_parallel_size"}
    assert "already freezes every base weight" in refused["freeze"]
    assert "tensor plans shard nn.Linear layers" in refused["tensor_parallel_size"]
    accepted: list[dict[str, Any]] = [
        {},
        {"zero_stage": 1},
        {"zero_stage": 2},
        {"zero_stage": 3, "trainable": ["head"]},
        {"cpu_offload": True},  # (ZeRO-3 with FSDP's CPU offload)
        {"zero_stage": 3, "offload_optimizer": True, "offload_parameters": True},
        {"zero_stage": 3, "mixed_precision": True, "gradient_checkpointing": True},
    ]
    for fields in accepted:
        assert ace3.unsupported_settings(ace3.TrainingConfig(lora=lora, **fields)) == [], fields
