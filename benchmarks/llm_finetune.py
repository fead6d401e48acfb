"""ACE3's LoRA fine-tuning of a tiny causal LM against a plain ``transformers`` ``Trainer``
script with ``peft``, on the same model directory, data, data order, batch, learning rate,
seed and number of steps, side by side in one run.

Everything is made here, nothing is downloaded: a synthetic text corpus (sentences of a small
seeded grammar), a BPE tokenizer trained on it with ``tokenizers``, and a Llama model built from
a ``LlamaConfig`` (about 1 M parameters) saved with ``save_pretrained`` (safetensors) into a
temporary directory. Each side loads it with ``AutoModelForCausalLM.from_pretrained`` (the load
is outside the timing) and trains LoRA adapters (same ``r``, ``lora_alpha``, dropout 0, the
attention and MLP projections) on windows of ``--seq-len`` tokens, ``labels = input_ids`` (the
model shifts them), in the dataset's order (no shuffling on either side):

- ACE3: ``ace3.Trainer(TrainingConfig(lora=LoRAConfig(...), shuffle=False, ...)).train(model,
  dataset)``, in process, default settings otherwise (AdamW, constant learning rate, a metrics
  report every 10 steps);
- transformers: ``peft.get_peft_model`` and ``transformers.Trainer`` with ``TrainingArguments``
  set to the same optimizer (torch's AdamW, same betas, eps, weight decay 0; fused on CUDA as
  ACE3's default is there), a constant learning rate without warm-up, no gradient clipping
  (ACE3's default), ``logging_steps=1``; its sampler is made sequential (a subclass overriding
  ``_get_train_sampler``), as ``shuffle=False`` makes ACE3's.

A callback on each side stamps the end of every optimizer step (and reads that step's loss).
Tokens per second are the tokens of the steps after the first ``--warmup`` over the time from
the end of step ``--warmup`` to the end of the last step: model load, adapter injection and
the first steps (lazy initialisation, allocator growth) are outside it. The loss compared is
the last step's. The two sides run ``--repeats`` times, alternating (transformers first), and
the figures are the medians (and the median of each repeat's ACE3 / transformers ratio). ::

    .venv/bin/python benchmarks/llm_finetune.py [--steps 100] [--warmup 5] [--repeats 5]
                                                [--device cpu|cuda]

The device is CUDA when one is present, else the CPU. Exits 0 when both sides ran, whether or
not the targets (ACE3 at least as fast; last losses within 2%) were met.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sdk"))

import peft  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from torch.utils.data import Dataset, SequentialSampler  # noqa: E402

import ace3  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SUBJECTS = ["cat", "dog", "bird", "fox", "horse", "farmer", "child", "teacher", "robot", "sailor"]
ADJECTIVES = ["small", "big", "red", "quiet", "old", "young", "happy", "lazy", "bright", "clever"]
VERBS = [
    "sees",
    "follows",
    "helps",
    "finds",
    "watches",
    "calls",
    "meets",
    "carries",
    "paints",
    "feeds",
]
PLACES = [
    "garden",
    "river",
    "market",
    "forest",
    "harbor",
    "school",
    "kitchen",
    "field",
    "tower",
    "bridge",
]


def synthetic_corpus(sentences: int, seed: int) -> list[str]:
    """Sentences of a small grammar: structure a model can learn in a few dozen steps."""
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        a, b = rng.choice(SUBJECTS), rng.choice(SUBJECTS)
        adj1, adj2 = rng.choice(ADJECTIVES), rng.choice(ADJECTIVES)
        lines.append(
            f"the {adj1} {a} {rng.choice(VERBS)} the {adj2} {b} near the {rng.choice(PLACES)}."
        )
    return lines


def make_model_dir(directory: Path, args: argparse.Namespace) -> list[str]:
    """Train the tokenizer, build the model from a config, save both; return the corpus."""
    sentences = args.steps * args.batch_size * args.seq_len // 10 + 100  # >= 12 tokens each
    corpus = synthetic_corpus(sentences, args.seed)
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=args.vocab, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tokenizer.train_from_iterator(corpus, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(directory)
    torch.manual_seed(args.seed)
    config = transformers.LlamaConfig(
        vocab_size=len(fast), hidden_size=args.hidden, intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=args.seq_len, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    return corpus


class Windows(Dataset[dict[str, torch.Tensor]]):
    """The corpus tokenized as one stream (an EOS after each sentence), cut into windows."""

    def __init__(self, directory: Path, corpus: list[str], length: int, count: int) -> None:
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        stream: list[int] = []
        for line in corpus:
            stream.extend(tokenizer(line)["input_ids"] + [tokenizer.eos_token_id])
        if len(stream) < length * count:
            raise SystemExit(f"the corpus gives {len(stream) // length} windows, {count} needed")
        tokens = torch.tensor(stream[: length * count]).view(count, length)
        self.windows = list(tokens)

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows[index], "labels": self.windows[index].clone()}


class StepClock:
    """End-of-step stamps and losses; synchronizes CUDA first so a stamp is the step's end."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.stamps: list[float] = []
        self.losses: list[float] = []

    def stamp(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())

    def tokens_per_second(self, warmup: int, tokens_per_step: int) -> float:
        measured = len(self.stamps) - 1 - warmup  # stamps[i] ends step i + 1
        return measured * tokens_per_step / (self.stamps[-1] - self.stamps[warmup - 1])


class AceClock(ace3.Callback):
    def __init__(self, clock: StepClock) -> None:
        super().__init__()
        self.clock = clock

    def on_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self.clock.stamp()
        self.clock.losses.append(float((logs or {})["loss"]))


class HFClock(transformers.TrainerCallback):
    def __init__(self, clock: StepClock) -> None:
        self.clock = clock

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.clock.stamp()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and "loss" in logs:
            self.clock.losses.append(float(logs["loss"]))


class SequentialTrainer(transformers.Trainer):
    """The plain Trainer, reading the dataset in order (ACE3's side has shuffle=False)."""

    def _get_train_sampler(self, *args: Any, **kwargs: Any) -> SequentialSampler:
        return SequentialSampler(self.train_dataset)


def run_ace3(directory: Path, data: Windows, args: argparse.Namespace) -> StepClock:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    clock = StepClock(args.device)
    config = ace3.TrainingConfig(
        batch_size=args.batch_size, max_steps=args.steps, learning_rate=args.lr, seed=args.seed,
        shuffle=False, validation_split=0.0,
        lora=ace3.LoRAConfig(r=args.rank, lora_alpha=args.alpha, target_modules=TARGETS),
    )  # fmt: skip
    ace3.Trainer(config, callbacks=[AceClock(clock)]).train(model, data)
    return clock


def run_transformers(directory: Path, data: Windows, args: argparse.Namespace) -> StepClock:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    transformers.set_seed(args.seed)
    lora = peft.LoraConfig(
        r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0, target_modules=TARGETS,
        task_type="CAUSAL_LM",
    )  # fmt: skip
    model = peft.get_peft_model(model, lora)
    clock = StepClock(args.device)
    with tempfile.TemporaryDirectory(prefix="ace3-hf-bench-") as output_dir:
        training_args = transformers.TrainingArguments(
            output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
            learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
            optim="adamw_torch_fused" if args.device == "cuda" else "adamw_torch",
            adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
            max_grad_norm=0.0, seed=args.seed, data_seed=args.seed, logging_steps=1,
            report_to=[], save_strategy="no", dataloader_num_workers=0, disable_tqdm=True,
            use_cpu=args.device == "cpu",
        )  # fmt: skip
        trainer = SequentialTrainer(
            model=model, args=training_args, train_dataset=data, callbacks=[HFClock(clock)]
        )
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
        trainer.train()
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of tokens/s")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None)
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cpu":
        os.environ["ACE3_DEVICE"] = "cpu"
    if not 0 < args.warmup < args.steps:
        parser.error("--warmup must be at least 1 and below --steps")
    tokens_per_step = args.batch_size * args.seq_len
    with tempfile.TemporaryDirectory(prefix="ace3-llm-bench-") as tmp:
        directory = Path(tmp) / "model"
        corpus = make_model_dir(directory, args)
        data = Windows(directory, corpus, args.seq_len, args.steps * args.batch_size)
        model = transformers.AutoModelForCausalLM.from_pretrained(directory)
        params = sum(p.numel() for p in model.parameters())
        del model
        print(
            f"torch {torch.__version__}, transformers {transformers.__version__}, peft "
            f"{peft.__version__}; {args.device}, {torch.get_num_threads()} threads\n"
            f"Llama {args.layers} layers x {args.hidden}, vocab {args.vocab}: {params / 1e6:.2f} M "
            f"parameters; LoRA r={args.rank} alpha={args.alpha:g} on {len(TARGETS)} projections; "
            f"batch {args.batch_size} x {args.seq_len} tokens, {args.steps} steps, lr {args.lr:g}, "
            f"same data in the same order; tokens/s over steps {args.warmup + 1}-{args.steps}",
            flush=True,
        )
        results: dict[str, list[StepClock]] = {"transformers": [], "ace3": []}
        for repeat in range(args.repeats):
            for name, run in (("transformers", run_transformers), ("ace3", run_ace3)):
                clock = run(directory, data, args)
                if len(clock.stamps) != args.steps or len(clock.losses) != args.steps:
                    raise SystemExit(f"{name}: {len(clock.stamps)} steps stamped, {args.steps} run")
                results[name].append(clock)
                rate = clock.tokens_per_second(args.warmup, tokens_per_step)
                print(
                    f"  repeat {repeat + 1} {name:<13} {rate:9.0f} tokens/s  "
                    f"loss first {clock.losses[0]:.5f} last {clock.losses[-1]:.5f}",
                    flush=True,
                )
    report(results, args, tokens_per_step)


def report(results: dict[str, list[StepClock]], args: argparse.Namespace, per_step: int) -> None:
    rates = {
        name: [c.tokens_per_second(args.warmup, per_step) for c in clocks]
        for name, clocks in results.items()
    }
    rate = {name: statistics.median(values) for name, values in rates.items()}
    last = {
        name: statistics.median(c.losses[-1] for c in clocks) for name, clocks in results.items()
    }
    first = {name: clocks[0].losses[0] for name, clocks in results.items()}
    ratio = rate["ace3"] / rate["transformers"]
    paired = statistics.median(
        a / t for a, t in zip(rates["ace3"], rates["transformers"], strict=True)
    )
    difference = abs(last["ace3"] - last["transformers"]) / last["transformers"]
    print(f"\n{'':<32} {'transformers':>14} {'ACE3':>14}")
    for label, pick in (("median", statistics.median), ("fastest", max), ("slowest", min)):
        row = f"tokens/s ({label})"
        print(f"{row:<32} {pick(rates['transformers']):>14.0f} {pick(rates['ace3']):>14.0f}")
    print(f"{'loss at step 1':<32} {first['transformers']:>14.5f} {first['ace3']:>14.5f}")
    print(f"{f'loss at step {args.steps}':<32} {last['transformers']:>14.5f} {last['ace3']:>14.5f}")
    print(
        f"ACE3 / transformers tokens/s: {ratio:.3f}, paired (median of each repeat's ratio) "
        f"{paired:.3f}  (target >= 1.0: {_met(ratio >= 1.0)})"
    )
    print(
        f"last-step loss difference: {difference:.3%}  (target <= 2%: {_met(difference <= 0.02)})"
    )


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


if __name__ == "__main__":
    main()
