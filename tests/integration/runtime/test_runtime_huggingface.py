"""A Hugging Face model directory (``model.kind='huggingface'``) trained by the engine under real
torchrun (2 ranks, gloo): a tiny GPT-2 built from a config with a tokenizer trained on local
text (nothing downloaded), LoRA on its Conv1D ``c_attn`` layers (under DDP and under ZeRO-3,
whose adapter checkpoint resumes on another number of ranks) and full fine-tuning with ZeRO-3;
what the job writes (``huggingface/`` and ``adapter/``) loads with ``transformers`` and ``peft``,
computes what the trained model computes, and generates; ``eval_prompts``' samples are what the
trained model generates."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import ace3
from tests.integration.runtime.test_runtime_torchrun import assert_ok, events, run_job, train_losses

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
tokenizers = pytest.importorskip("tokenizers")

TEXT = "the quick brown fox jumps over the lazy dog and the cat sat on the mat " * 20
LENGTH = 16

DATASET_PY = f"""
import torch
from torch.utils.data import Dataset

LENGTH = {LENGTH}


class Windows(Dataset):
    def __init__(self, count):
        stream = (torch.arange(count * LENGTH + 1) * 7) % 50 + 5
        self.windows = [stream[i * LENGTH : (i + 1) * LENGTH] for i in range(count)]

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, index):
        ids = self.windows[index]
        return {{"input_ids": ids, "labels": ids.clone()}}


def build_dataset(split):
    return Windows(64 if split == "train" else 8)
"""


def _tokenizer(directory: Path) -> None:
    model = tokenizers.models.BPE(unk_token="<unk>")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=64, special_tokens=["<unk>", "<eos>"])
    tokenizer.train_from_iterator([TEXT], trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<eos>"
    )
    fast.save_pretrained(str(directory))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf-runtime")
    source = root / "gpt2"
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, eos_token_id=1, bos_token_id=1,
    )  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(str(source))
    transformers.GenerationConfig(max_new_tokens=4, eos_token_id=1).save_pretrained(str(source))
    _tokenizer(source)
    (root / "data").mkdir()
    (root / "data" / "dataset.py").write_text(DATASET_PY)
    return root


def _job(workdir: Path, **config: Any) -> dict[str, Any]:
    return {
        "job_id": "hf",
        "config": {
            "batch_size": 8,
            "max_steps": 6,
            "learning_rate": 0.05,
            "seed": 0,
            "log_interval": 1,
            **config,
        },
        "model": {
            "path": str(workdir / "gpt2"),
            "kind": "huggingface",
            "factory": "from_pretrained",
        },
        "dataset": {"path": str(workdir / "data")},
    }


PROBE = ((torch.arange(LENGTH) * 7) % 50 + 5).unsqueeze(0)


def _logits(model: Any) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(PROBE).logits


LORA_ZERO3 = {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "bias": "lora_only"}
LORA_ZERO3_CONFIG = {
    "lora": LORA_ZERO3, "zero_stage": 3, "save_interval": 3, "eval_prompts": ["the quick"],
    "eval_max_new_tokens": 3,
}  # fmt: skip


@pytest.fixture(scope="module")
def lora_zero3_run(workdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LoRA (its biases training too) with ZeRO-3 on 2 ranks, a checkpoint at steps 3 and 6,
    and a sample generation (every rank in the sharded, adapted model's generate)."""
    job_dir = tmp_path_factory.mktemp("lora-zero3")
    job = _job(workdir, **LORA_ZERO3_CONFIG)
    assert_ok(run_job(job, job_dir, nproc=2))
    return job_dir


@pytest.mark.parametrize("layout", ["ddp", "zero3"])
def test_lora_on_gpt2_exports_a_merged_directory_and_peft_adapters(
    workdir: Path, tmp_path: Path, layout: str, request: pytest.FixtureRequest
) -> None:
    if layout == "zero3":  # the adapters placed before FSDP shards the model, gathered at the end
        bias = "lora_only"
        tmp_path = request.getfixturevalue("lora_zero3_run")
    else:
        bias = "none"
        lora = {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn"], "bias": bias}
        assert_ok(run_job(_job(workdir, lora=lora), tmp_path, nproc=2))
    artifacts = tmp_path / "output" / "artifacts"
    export, adapter = artifacts / "huggingface", artifacts / "adapter"
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= {p.name for p in export.iterdir()}  # fmt: skip
    assert json.loads((export / "config.json").read_text())["dtype"] == "float32"
    from safetensors import safe_open

    with safe_open(str(export / "model.safetensors"), "pt") as weights:
        names = set(weights.keys())
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names  # tied: once
    assert {p.name for p in adapter.iterdir()} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }

    merged = transformers.AutoModelForCausalLM.from_pretrained(str(export))
    base = transformers.AutoModelForCausalLM.from_pretrained(str(workdir / "gpt2"))
    base_logits = _logits(base)
    with_adapter = peft.PeftModel.from_pretrained(base, str(adapter))
    torch.testing.assert_close(_logits(merged), _logits(with_adapter), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(_logits(merged), base_logits), "the adapters did not train"
    # the base stayed frozen: only the adapted layers' weights (and their biases, trained with
    # bias='lora_only') differ from the source model's
    merged_weights = dict(merged.named_parameters())
    source = transformers.AutoModelForCausalLM.from_pretrained(str(workdir / "gpt2"))
    moved = {n for n, p in source.named_parameters() if not torch.equal(p, merged_weights[n])}
    adapted = {f"transformer.h.{i}.attn.c_attn.{w}" for i in (0, 1) for w in ("weight", "bias")}
    assert moved == (adapted if bias == "lora_only" else {n for n in adapted if "weight" in n})
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(export))
    generated = merged.generate(**tokenizer("the quick", return_tensors="pt"), max_new_tokens=3)
    assert generated.shape[1] >= 3
    if layout == "zero3":
        [record] = [e for e in events(tmp_path) if e["type"] == "eval_samples"]
        assert [sample["prompt"] for sample in record["samples"]] == ["the quick"]
    [summary] = [e for e in events(tmp_path) if e["type"] == "summary"]
    c_attn = 2 * 4 * (16 + 48) + (2 * 48 if bias == "lora_only" else 0)  # (+ their biases)
    final = summary["final_metrics"]
    assert final["trainable_parameters"] == c_attn
    assert final["val_perplexity"] == pytest.approx(math.exp(final["val_loss"]))


def test_full_fine_tuning_with_zero3_gathers_the_weights_it_exports(
    workdir: Path, tmp_path: Path
) -> None:
    prompts = ["the quick brown", "the lazy"]
    job = _job(workdir, zero_stage=3, save_interval=6, eval_prompts=prompts, eval_max_new_tokens=4)
    done = run_job(job, tmp_path, nproc=2)
    assert_ok(done)
    export = tmp_path / "output" / "artifacts" / "huggingface"
    trained = transformers.AutoModelForCausalLM.from_pretrained(str(export))
    base = transformers.AutoModelForCausalLM.from_pretrained(str(workdir / "gpt2"))
    names = dict(trained.named_parameters())
    moved = [n for n, p in base.named_parameters() if not torch.equal(p, names[n])]
    assert len(moved) == len(names), "every weight trained and was gathered whole"
    assert torch.isfinite(_logits(trained)).all()
    # eval_prompts: at the run's last validation, every rank took part in the sharded model's
    # generation and rank 0 wrote what the trained model completes greedily
    [record] = [e for e in events(tmp_path) if e["type"] == "eval_samples"]
    assert (record["step"], record["max_new_tokens"]) == (6, 4)
    assert [sample["prompt"] for sample in record["samples"]] == prompts
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(export))
    trained.eval()
    for sample in record["samples"]:
        ids = tokenizer(sample["prompt"], add_special_tokens=False, return_tensors="pt")
        new = trained.generate(**ids, max_new_tokens=4, do_sample=False)[
            0, ids.input_ids.shape[1] :
        ]
        new = new[: next((i for i, t in enumerate(new.tolist()) if t == 1), len(new))]  # EOS
        assert sample["completion"] == tokenizer.decode(new, skip_special_tokens=True)
        assert sample["completion_tokens"] == len(new) and not sample["truncated"]


def test_a_lora_zero3_checkpoint_holds_the_adapters_and_resumes_on_one_process(
    workdir: Path, tmp_path: Path, lora_zero3_run: Path
) -> None:
    """The step-3 checkpoint of the 2-rank run (sharded, adapters only) continues on one
    process as the uninterrupted run did (the same samples in each step; float sums in
    another order, so close rather than bitwise: in-process ZeRO-3 resumes bit for bit,
    tests/unit/runtime/test_lora.py)."""
    from safetensors.torch import load_file

    from ace3.files import sha256_file

    checkpoint = lora_zero3_run / "output" / "checkpoints" / "step-00000003.dcp.tar"
    saved = ace3.load_checkpoint(checkpoint)["model"]  # no base weight (nor the tied lm_head)
    adapted = [f"transformer.h.{i}.attn.c_attn" for i in (0, 1)]
    assert set(saved) == {"_ace3_lora_base_sha256"} | {
        f"{layer}.{tensor}"
        for layer in adapted
        for tensor in ("lora_A.default.weight", "lora_B.default.weight", "base_layer.bias")
    }  # fmt: skip
    job = _job(workdir, **LORA_ZERO3_CONFIG)
    job.update(resume_from=str(checkpoint), resume_sha256=sha256_file(checkpoint))
    done = run_job(job, tmp_path, nproc=1)
    assert_ok(done)
    assert "at step 3" in done.stdout and "written by 2 process(es)" in done.stdout
    losses = [dict(train_losses(events(d))) for d in (lora_zero3_run, tmp_path)]
    assert losses[1] == pytest.approx({s: v for s, v in losses[0].items() if s > 3}, rel=1e-5)
    final = [
        next(e for e in events(d) if e["type"] == "summary")["final_metrics"]
        for d in (lora_zero3_run, tmp_path)
    ]
    assert final[1]["val_loss"] == pytest.approx(final[0]["val_loss"], rel=1e-5)
    assert final[1]["trainable_parameters"] == final[0]["trainable_parameters"]
    adapters = [load_file(str(d / "output/artifacts/adapter/adapter_model.safetensors"))
                for d in (lora_zero3_run, tmp_path)]  # fmt: skip
    assert adapters[0].keys() == adapters[1].keys()
    for name, value in adapters[0].items():
        torch.testing.assert_close(adapters[1][name], value, rtol=0, atol=5e-3)


CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = TEXT.split()


def _chat(index: int) -> dict[str, Any]:
    question = " ".join(WORDS[index % 7 : index % 7 + 3])
    answer = " ".join(WORDS[index % 5 : index % 5 + 2 + index % 3])
    return {"messages": [{"role": "user", "content": question},
                         {"role": "assistant", "content": answer}]}  # fmt: skip


@pytest.fixture(scope="module")
def chat_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf-chat")
    source = root / "gpt2"
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    special = ["<unk>", "<eos>", "<pad>", "<|im_start|>", "<|im_end|>"]
    bpe.train_from_iterator(
        [TEXT], tokenizers.trainers.BpeTrainer(vocab_size=80, special_tokens=special)
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>"
    )
    fast.chat_template = CHATML
    fast.save_pretrained(str(source))
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=len(fast), n_positions=64, n_embd=16, n_layer=2,
                                     n_head=2, eos_token_id=1, bos_token_id=1)  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(str(source))
    (root / "chat.jsonl").write_text("".join(json.dumps(_chat(i)) + "\n" for i in range(48)))
    return root


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_chat_records_are_tokenized_masked_and_trained_on_two_ranks(
    chat_workdir: Path, tmp_path: Path, packing: bool
) -> None:
    job = {
        "job_id": "chat",
        "config": {
            "batch_size": 4,
            "max_steps": 6,
            "learning_rate": 0.05,
            "seed": 0,
            "log_interval": 1,
            "packing": packing,
            "sequence_length": 24,
            "eval_prompts": ["the quick"],  # a user message in the chat template
            "eval_max_new_tokens": 3,
        },
        "model": {
            "path": str(chat_workdir / "gpt2"),
            "kind": "huggingface",
            "factory": "from_pretrained",
        },
        "dataset": {"path": str(chat_workdir / "chat.jsonl")},
    }
    done = run_job(job, tmp_path, nproc=2)
    assert_ok(done)
    logged = done.stdout + done.stderr
    assert "chat.jsonl: 43 chat example(s)" in logged, logged[-3000:]  # 5 held out
    assert ("packed into" in logged) == packing
    [summary] = [e for e in events(tmp_path) if e["type"] == "summary"]
    final = summary["final_metrics"]
    assert math.isfinite(final["train_loss"]) and math.isfinite(final["val_perplexity"])
    assert (tmp_path / "output" / "artifacts" / "huggingface" / "tokenizer_config.json").is_file()
    [record] = [e for e in events(tmp_path) if e["type"] == "eval_samples"]
    [sample] = record["samples"]
    assert sample["prompt"] == "the quick" and sample["completion_tokens"] <= 3
