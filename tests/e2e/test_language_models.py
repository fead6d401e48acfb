"""A Hugging Face model directory fine-tuned through the real stack (API, Postgres, Redis, Celery
worker, torchrun with 2 gloo ranks): a tiny GPT-2 built from a config with a tokenizer trained
on local text (nothing downloaded) is uploaded with ``client.load_model(dir)``, trained with
LoRA on its Conv1D ``c_attn`` layers on a ``tokens`` dataset (labels given as the input ids, the
model shifts them itself), and what comes back with ``client.jobs.download_artifacts`` loads
with ``transformers`` and ``peft`` and generates. The same model with (inputs, targets) data is
refused at submission."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ace3

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
tokenizers = pytest.importorskip("tokenizers")

TEXT = "the quick brown fox jumps over the lazy dog and the cat sat on the mat " * 20


def _gpt2_directory(directory: Path) -> None:
    import torch

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, eos_token_id=1, bos_token_id=1,
    )  # fmt: skip
    transformers.GPT2LMHeadModel(config).save_pretrained(str(directory))
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    bpe.train_from_iterator(
        [TEXT], tokenizers.trainers.BpeTrainer(vocab_size=64, special_tokens=["<unk>", "<eos>"])
    )
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", eos_token="<eos>"
    ).save_pretrained(str(directory))


def test_a_hugging_face_directory_is_fine_tuned_with_lora_and_comes_back_deployable(
    client: ace3.Client, tmp_path: Path
) -> None:
    import torch

    source = tmp_path / "gpt2"
    _gpt2_directory(source)
    model = client.load_model(source)
    assert model.model.kind == "huggingface"
    shards = tmp_path / "tokens"
    shards.mkdir()
    ids = (np.arange(2049) * 7 % 50 + 5).astype(np.uint16)  # a pattern the model can learn
    (shards / "0.bin").write_bytes(ids.tobytes())
    data = client.load_dataset(shards, format="tokens")

    config = ace3.TrainingConfig(
        num_gpus=2, batch_size=8, max_steps=8, learning_rate=0.05, seed=0, sequence_length=16,
        log_interval=1, lora=ace3.LoRAConfig(r=4, lora_alpha=8, target_modules=["c_attn"]),
    )  # fmt: skip
    result = ace3.DistributedTrainer(config).train(model=model, train_dataset=data)
    assert result.final_metrics["trainable_parameters"] == 2 * 4 * (16 + 48)
    losses = [m.value for m in client.jobs.metrics(result.job_id) if m.name == "train_loss"]
    assert losses[-1] < losses[0], losses

    out = tmp_path / "out"
    paths = client.jobs.download_artifacts(result.job_id, out)
    assert out / "huggingface" / "config.json" in paths
    assert out / "adapter" / "adapter_model.safetensors" in paths
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(out / "huggingface")).eval()
    base = transformers.AutoModelForCausalLM.from_pretrained(str(source))
    adapted = peft.PeftModel.from_pretrained(base, str(out / "adapter")).eval()
    probe = torch.from_numpy(ids[:16].astype(np.int64)).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(
            merged(probe).logits, adapted(probe).logits, rtol=1e-4, atol=1e-4
        )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out / "huggingface"))
    generated = merged.generate(**tokenizer("the quick", return_tensors="pt"), max_new_tokens=3)
    assert generated.shape[1] >= 3
    assert json.loads((out / "huggingface" / "config.json").read_text())["model_type"] == "gpt2"
    # the export was registered as a model of the owner's, named after the job that made it
    job = client.jobs.retrieve(result.job_id)
    assert job.fine_tuned_model_id is not None
    tuned_model = client.models.retrieve(job.fine_tuned_model_id)
    assert (tuned_model.kind, tuned_model.source_job_id) == ("huggingface", job.id)
    assert tuned_model.parameter_count == merged.num_parameters()
    assert result.final_metrics["trained_tokens"] == 8 * 8 * 16  # steps x batch x length

    # a LoRA target that matches no module of the stored directory: refused at submission
    wrong = ace3.LoRAConfig(target_modules=["q_proj"])
    with pytest.raises(ace3.errors.ValidationError, match=r"'q_proj' matches no module .* c_attn"):
        ace3.DistributedTrainer(
            ace3.TrainingConfig(max_steps=1, sequence_length=16, lora=wrong)
        ).train(model=model, train_dataset=data)

    # chat records need the directory's chat template, which this one lacks: refused
    turn = [{"role": "user", "content": "the quick"}, {"role": "assistant", "content": "brown fox"}]
    chats = tmp_path / "chat.jsonl"
    chats.write_text(json.dumps({"messages": turn}) + "\n")
    with pytest.raises(ace3.errors.ValidationError, match="has no chat template"):
        ace3.DistributedTrainer(ace3.TrainingConfig(max_steps=1)).train(
            model=model, train_dataset=client.load_dataset(chats)
        )
    # prompt/completion records are tokenized in the job and only the completions learned
    words = TEXT.split()
    records = [
        {"prompt": " ".join(words[i % 9 : i % 9 + 3]), "completion": " " + words[i % 9 + 3]}
        for i in range(32)
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    tuned = ace3.DistributedTrainer(
        ace3.TrainingConfig(num_gpus=2, batch_size=4, max_steps=4, learning_rate=0.05, packing=True)
    ).train(model=model, train_dataset=client.load_dataset(prompts))
    assert tuned.final_metrics["val_perplexity"] > 1
    logs = "\n".join(line.line for line in client.jobs.iter_logs(tuned.job_id))
    assert "29 prompt/completion example(s)" in logs and "packed into" in logs, logs[-3000:]

    # (inputs, targets) pairs give a causal LM no labels: refused before anything runs
    pairs = tmp_path / "pairs.npz"
    np.savez(pairs, inputs=ids[:64].reshape(4, 16).astype(np.int64), targets=np.zeros(4, np.int64))
    with pytest.raises(ace3.errors.ValidationError, match="only when given labels"):
        ace3.DistributedTrainer(ace3.TrainingConfig(max_steps=1)).train(
            model=model, train_dataset=client.load_dataset(pairs)
        )
