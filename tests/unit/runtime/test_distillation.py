"""Knowledge distillation in process: a distilled student beats the same student trained alone
(same seed, same steps), the loss parts are reported beside ``train_loss``, teacher weights
load from a local file (ACE3 checkpoint, plain state dict, safetensors), feature layers of
different widths are matched through a learned projection, attention maps where the model
exposes them, and what cannot work is refused with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import ace3
from ace3.config import unsupported_settings
from ace3.errors import UnsupportedFeatureError
from ace3.runtime.techniques.teacher import local_teacher
from ace3.trainers._submit import refuse_local_only


def _digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits inputs, clean labels, and labels of which 60% were replaced at random."""
    inputs, labels = load_digits(return_X_y=True)
    x = torch.tensor(inputs / 16.0, dtype=torch.float32)
    y = torch.tensor(labels)
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=generator)
    x, y = x[order], y[order]
    noisy = y.clone()
    flip = torch.rand(len(y), generator=generator) < 0.6
    noisy[flip] = torch.randint(0, 10, (int(flip.sum()),), generator=generator)
    return x, y, noisy


X, Y, NOISY = _digits()
TRAIN, VALID = slice(0, 1400), slice(1400, None)


def _teacher_net() -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def _student_net(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


@pytest.fixture(scope="module")
def teacher() -> nn.Sequential:
    """An MLP trained on the clean labels (about 97% validation accuracy)."""
    torch.manual_seed(0)
    model = _teacher_net()
    optimizer = torch.optim.AdamW(model.parameters(), 0.01)
    for _ in range(8):
        for start in range(0, 1400, 64):
            batch = slice(start, start + 64)
            loss = F.cross_entropy(model(X[batch]), Y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model


def _accuracy(model: nn.Module) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(X[VALID]).argmax(dim=1) == Y[VALID]).float().mean())


def _train_student(seed: int, samples: int = 400, epochs: int = 3, **distillation: object):
    student = _student_net(seed)
    fields: dict[str, object] = {
        "batch_size": 32, "epochs": epochs, "learning_rate": 0.01, "validation_split": 0.0,
        "seed": seed, "log_interval": 5,
    }  # fmt: skip
    if distillation:
        fields["distillation"] = ace3.DistillationConfig(**distillation)
    data = TensorDataset(X[:samples], NOISY[:samples])
    result = ace3.Trainer(ace3.TrainingConfig(**fields)).train(student, data)
    return student, result


def test_the_distilled_student_beats_the_same_student_trained_alone(teacher: nn.Module) -> None:
    teacher_accuracy = _accuracy(teacher)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    teacher.train()
    plain, _ = _train_student(seed=0, epochs=5)
    distilled, result = _train_student(
        seed=0, epochs=5, teacher=teacher, temperature=2.0, alpha=0.7
    )
    plain_accuracy, distilled_accuracy = _accuracy(plain), _accuracy(distilled)
    print(
        f"teacher {teacher_accuracy:.3f}; student alone {plain_accuracy:.3f}, "
        f"distilled {distilled_accuracy:.3f} (same seed, same 65 steps)"
    )
    # Measured over seeds 0-7: alone 0.34-0.73, distilled 0.76-0.88 (at least 0.126 better
    # with every seed), teacher 0.97; seed 0: alone 0.403, distilled 0.861.
    assert teacher_accuracy > 0.9
    assert plain_accuracy < teacher_accuracy - 0.2  # the task is hard for the student alone
    assert distilled_accuracy > plain_accuracy + 0.1
    assert distilled_accuracy > 0.75
    # The loss parts are reported beside train_loss, at every report, and in the summary.
    history = result.history
    for name in ("kd_loss", "feature_loss", "task_loss"):
        assert [step for step, _ in history[name]] == [step for step, _ in history["train_loss"]]
        assert name in result.final_metrics
    step, total = history["train_loss"][0]
    parts = {name: dict(history[name])[step] for name in ("kd_loss", "task_loss")}
    assert total == pytest.approx(0.7 * parts["kd_loss"] + 0.3 * parts["task_loss"], rel=1e-5)
    assert history["kd_loss"][-1][1] < 0.8 * history["kd_loss"][0][1]
    # The caller's teacher is untouched: weights, training mode, requires_grad.
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert teacher.training and all(p.requires_grad for p in teacher.parameters())


@pytest.mark.parametrize("kind", ["ace3 checkpoint", "state dict", "safetensors"])
def test_teacher_weights_load_from_a_local_file(
    teacher: nn.Module, tmp_path: Path, kind: str
) -> None:
    """A fresh teacher with the trained weights from a file distils exactly as the trained
    module itself."""
    state = {k: v.clone() for k, v in teacher.state_dict().items()}
    if kind == "ace3 checkpoint":
        path = ace3.save_checkpoint({"model": state, "step": 8}, tmp_path / "teacher.pt")
    elif kind == "state dict":
        path = tmp_path / "weights.pt"
        torch.save(state, path)
    else:
        path = tmp_path / "teacher.safetensors"
        save_file(state, str(path))
    torch.manual_seed(123)
    fresh = _teacher_net()
    settings = {"temperature": 2.0, "alpha": 0.7}
    from_file, _ = _train_student(1, 96, teacher=fresh, teacher_checkpoint=str(path), **settings)
    from_module, _ = _train_student(1, 96, teacher=teacher, **settings)
    for a, b in zip(from_file.parameters(), from_module.parameters(), strict=True):
        assert torch.equal(a, b)


def test_feature_layers_of_different_widths_learn_through_a_projection(
    teacher: nn.Module,
) -> None:
    student, result = _train_student(
        2, 192, teacher=teacher, feature_layers={"1": "1"}, feature_loss_weight=1.0,
        hidden_loss="cosine",
    )  # fmt: skip
    assert not student[1]._forward_hooks  # the caller's module keeps no hook of the run
    feature = [value for _, value in result.history["feature_loss"]]
    assert 0 < feature[-1] < feature[0]  # the projection (16 -> 128) and the student learn
    step, total = result.history["train_loss"][0]
    parts = {n: dict(result.history[n])[step] for n in ("kd_loss", "task_loss", "feature_loss")}
    expected = 0.5 * parts["kd_loss"] + 0.5 * parts["task_loss"] + parts["feature_loss"]
    assert total == pytest.approx(expected, rel=1e-5)


class Attending(nn.Module):
    """Returns logits and attention maps, as models with output_attentions=True do."""

    def __init__(self, heads: int, layers: int) -> None:
        super().__init__()
        self.heads, self.layers = heads, layers
        self.query = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        tokens = x.reshape(x.shape[0], 4, 8)
        q = self.query(tokens)
        maps = []
        for layer in range(self.layers):
            scores = (q * (layer + 1)) @ tokens.transpose(1, 2) / 8**0.5
            maps.append(scores.softmax(-1).unsqueeze(1).expand(-1, self.heads, -1, -1))
        return {"logits": self.head(q.mean(dim=1)), "attentions": maps}


def test_attention_maps_are_distilled_where_the_model_exposes_them() -> None:
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(x, (x.sum(dim=1) > 0).long() + (x[:, 0] > 1).long())
    torch.manual_seed(0)
    teacher, student = Attending(heads=4, layers=3), Attending(heads=2, layers=2)
    config = ace3.TrainingConfig(
        batch_size=16, epochs=2, validation_split=0.0, log_interval=1,
        distillation=ace3.DistillationConfig(teacher=teacher, attention_loss_weight=1.0),
    )  # fmt: skip
    result = ace3.Trainer(config).train(student, data)
    attention = [value for _, value in result.history["attention_loss"]]
    assert attention[0] > 0 and attention[-1] < attention[0]
    plain = nn.Sequential(nn.Linear(32, 3))
    config = ace3.TrainingConfig(
        batch_size=16, epochs=1, validation_split=0.0,
        distillation=ace3.DistillationConfig(teacher=nn.Linear(32, 3), attention_loss_weight=1.0),
    )  # fmt: skip
    with pytest.raises(ValueError, match="attention_loss_weight > 0 needs the student's attention"):
        ace3.Trainer(config).train(plain, data)


def test_what_cannot_work_is_refused_with_the_reason(teacher: nn.Module) -> None:
    def refusal(**fields: object) -> str:
        config = ace3.TrainingConfig(
            num_gpus=2, distillation=ace3.DistillationConfig(teacher="mdl_1"), **fields
        )
        return " ".join(p.reason for p in unsupported_settings(config))

    assert "cannot run with pipeline parallelism" in refusal(parallelism="pipeline")
    assert "cannot run with tensor parallelism" in refusal(
        parallelism="model", model_sharding_strategy="tensor"
    )
    assert "cannot run with CPU offload" in refusal(zero_stage=3, cpu_offload=True)
    assert refusal(zero_stage=1) == refusal(zero_stage=3) == ""
    with pytest.raises(pydantic.ValidationError, match="feature_loss_weight needs feature_layers"):
        ace3.DistillationConfig(teacher=teacher, feature_loss_weight=0.5)
    with pytest.raises(pydantic.ValidationError, match="exactly one teacher"):
        ace3.DistillationConfig(temperature=2.0)
    missing = ace3.DistillationConfig(teacher=teacher, teacher_checkpoint="/nowhere/teacher.pt")
    with pytest.raises(FileNotFoundError, match="teacher_checkpoint: no checkpoint file"):
        local_teacher(ace3.TrainingConfig(distillation=missing))  # checked where it is read
    # A live module never goes on the wire: a remote job with one is refused before uploading.
    config = ace3.TrainingConfig(distillation=ace3.DistillationConfig(teacher=teacher))
    assert "teacher_module" not in config.model_dump(mode="json")["distillation"]
    with pytest.raises(UnsupportedFeatureError, match="only an in-process run can use"):
        refuse_local_only(config)
    # Run time: a module name the student lacks; a stored teacher in process; no logits.
    with pytest.raises(ValueError, match="the student has no module 'encoder'"):
        _train_student(0, 32, teacher=teacher, feature_layers={"encoder": "1"})
    with pytest.raises(ValueError, match="an in-process run needs the teacher as a live"):
        _train_student(0, 32, teacher="mdl_1")
    student = _student_net(0)
    config = ace3.TrainingConfig(
        batch_size=16, epochs=1, validation_split=0.0,
        distillation=ace3.DistillationConfig(teacher=teacher),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"must return \(loss, outputs\)"):
        ace3.Trainer(config).train(
            student,
            TensorDataset(X[:32], Y[:32]),
            compute_loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
        )


def _two_rank_distillation(out_dir: str) -> None:
    """One rank of ``torchrun --nproc-per-node 2`` (see the test below): distil under FSDP
    (zero_stage 3) and save the student it ended with."""
    rank = int(os.environ["RANK"])
    torch.save(_small_distillation(processes=2, zero_stage=3), Path(out_dir) / f"rank{rank}.pt")


def _small_distillation(processes: int, zero_stage: int) -> dict[str, object]:
    torch.manual_seed(5)
    teacher = _teacher_net()
    student = _student_net(3)
    config = ace3.TrainingConfig(
        num_gpus=processes, zero_stage=zero_stage, batch_size=32, epochs=2,
        validation_split=0.0, learning_rate=0.01, seed=3, log_interval=1,
        distillation=ace3.DistillationConfig(teacher=teacher, feature_layers={"1": "1"}),
    )  # fmt: skip
    run = ace3.Trainer(config).train(student, TensorDataset(X[:128], NOISY[:128]))
    return {
        "student": {k: v.detach().clone() for k, v in student.state_dict().items()},
        "feature_loss": [value for _, value in run.history.get("feature_loss", [])],
    }


def test_two_fsdp_ranks_distil_what_one_process_does(tmp_path: Path) -> None:
    """Two ranks (ZeRO-3: FSDP) learn what one process learns from the same global batches
    (the 16 -> 128 projection's gradients averaged over the ranks, or the student would
    differ), and both ranks end with the same student. (DDP runs in tests/e2e.)"""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        __file__, str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path.cwd())}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for name, value in ranks[0]["student"].items():
        assert torch.equal(value, ranks[1]["student"][name]), name
    alone = _small_distillation(processes=1, zero_stage=0)
    for name, value in alone["student"].items():
        assert torch.allclose(value, ranks[0]["student"][name], atol=1e-5), name
    feature = ranks[0]["feature_loss"]  # rank 0 reports
    assert feature and feature[-1] < feature[0]


if __name__ == "__main__":  # a rank of the test above
    _two_rank_distillation(sys.argv[1])
    # Ended as ace3.runtime ends a rank (see its __main__): Gloo's threads outlive the group and
    # abort an interpreter that finalizes now and then (SIGABRT: "terminate called without an
    # active exception", once in the suite's runs).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def test_the_third_seeds_pipeline_distil_prune_quantize_is_one_run(
    teacher: nn.Module, tmp_path: Path
) -> None:
    """Distillation, pruning and int8 quantization together (the third seed's "begin with
    knowledge distillation, apply pruning during training, finish with quantization")."""
    pytest.importorskip("torchao")
    student = _student_net(0)
    config = ace3.TrainingConfig(
        batch_size=32, epochs=2, learning_rate=0.01, validation_split=0.25, seed=0,
        distillation=ace3.DistillationConfig(teacher=teacher, temperature=2.0, alpha=0.7),
        pruning=ace3.PruningConfig(target_sparsity=0.5, schedule="cubic", begin_step=4,
                                   end_step=16, frequency=4),
        quantization=ace3.QuantizationConfig(precision="int8", method="dynamic"),
    )  # fmt: skip
    save_dir = tmp_path / "run" / "checkpoints"
    result = ace3.Trainer(
        config, checkpoint_config=ace3.CheckpointConfig(save_dir=str(save_dir))
    ).train(student, TensorDataset(X[:400], NOISY[:400]))
    final = result.final_metrics
    assert final["sparsity"] == pytest.approx(0.5, abs=0.01)
    assert "kd_loss" in final and "pruning_accuracy_drop" in final
    assert final["quantized_size_bytes"] < final["float_size_bytes"]
    assert "quantized_val_accuracy" in final
    weights = [m.weight for m in student if isinstance(m, nn.Linear)]
    zeros = sum(int((w == 0).sum()) for w in weights) / sum(w.numel() for w in weights)
    assert zeros == pytest.approx(0.5, abs=0.01)  # the student itself holds the pruned weights
