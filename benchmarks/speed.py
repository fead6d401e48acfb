"""Step time with the speed settings, side by side in one process (``ace3.Trainer``, in-process):
eager against ``compile=True``, and torch's optimizer kernels (``optimizer_impl``: for_loop,
foreach, fused) on the same model, data, seed and AdamW.

The model is a small pre-norm transformer block stack whose attention goes through
``F.scaled_dot_product_attention`` (token ids in, next-token loss), so compile has something to
fuse. Each configuration trains ``--steps`` optimizer steps; a callback stamps the end of every
step, and the figure is the median time per step after the first ``--warmup`` steps (the
compile itself happens in those; its cost is printed apart as the first steps' extra time).
Also printed: the final training loss of each (compile must not change it beyond float
reordering). ::

    .venv/bin/python benchmarks/speed.py [--steps 40] [--warmup 5] [--device cpu]

On a GPU worker add ``--device cuda`` (then ``allow_tf32`` and the fused optimizer apply).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sdk"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import ace3  # noqa: E402

VOCAB, SEQ, WIDTH, HEADS, LAYERS = 256, 64, 128, 4, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.out = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(
            nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(b, t, WIDTH))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def compute_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    tokens, targets = batch
    return F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


class StepClock(ace3.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = [time.perf_counter()]

    def on_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        self.stamps.append(time.perf_counter())


def run(label: str, args: argparse.Namespace, **fields: object) -> None:
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (args.steps * 16, SEQ + 1), generator=generator)
    data = (tokens[:, :-1], tokens[:, 1:])
    torch.manual_seed(0)
    model = TinyLM()
    clock = StepClock()
    config = ace3.TrainingConfig(
        epochs=1, batch_size=16, max_steps=args.steps, learning_rate=1e-3,
        validation_split=0.0, log_interval=args.steps, **fields,
    )  # fmt: skip
    result = ace3.Trainer(config, callbacks=[clock]).train(model, data, compute_loss=compute_loss)
    steps = [b - a for a, b in zip(clock.stamps, clock.stamps[1:], strict=False)]
    steady = steps[args.warmup :]
    median = statistics.median(steady)
    first = sum(steps[: args.warmup]) - median * args.warmup
    loss = result.history["train_loss"][-1][1]
    print(
        f"{label:<28} {median * 1e3:9.2f} ms/step  (first {args.warmup} steps +{first:6.2f} s)"
        f"  final train_loss {loss:.5f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    if args.device == "cpu":
        import os

        os.environ["ACE3_DEVICE"] = "cpu"
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads")
    run("eager", args)
    run("compile=True", args, compile=True)
    for impl in ("for_loop", "foreach", "fused"):
        run(f"optimizer_impl={impl}", args, optimizer_impl=impl)
    if args.device == "cuda":
        run("compile + allow_tf32", args, compile=True, allow_tf32=True)


if __name__ == "__main__":
    main()
