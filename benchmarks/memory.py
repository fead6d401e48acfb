"""Peak training memory of one model under each precision level, gradient checkpointing and
each optimizer, side by side.

Trains one deep residual MLP (an ``nn.Sequential`` of ``depth`` blocks
``x + GELU(Linear(LayerNorm(x)))`` and a 10-class head) on synthetic data made here (nothing is
downloaded), in process through ``ace3.Trainer(config).train(module, (inputs, targets))``,
once per configuration:

- ``baseline``: float32, AdamW;
- ``o1_bf16``, ``o2_bf16``, ``o3_bf16``: mixed precision at levels O1-O3 with bfloat16;
- ``checkpointing``: gradient checkpointing (float32, AdamW);
- ``adamw`` (the baseline again: the spread between the two rows is the run-to-run noise),
  ``adam``, ``sgd``, ``memory_efficient_adam``, ``adam8bit`` (float32).

Every configuration runs in its own fresh Python process (``--one NAME --json``), so one run's
allocator caches and peaks cannot leak into the next; the parent collects each child's JSON
and prints one table. Each child first trains a tiny copy of the model for 2 steps with the
same settings (paying one-time costs: lazy imports, thread pools, kernel set-up), then the
measured run. The figures are the engine's own ``final_metrics``: ``peak_memory_mb`` (CPU:
growth of the process's resident set above its size when training started, sampled every
5 ms; CUDA: ``torch.cuda.max_memory_allocated``) and ``state_memory_mb`` (parameters +
gradients + optimizer state at the end). On CPU the children run with glibc's
``MALLOC_MMAP_THRESHOLD_=65536`` so that freed tensors go back to the OS and the resident set
follows the live tensors (``--default-malloc`` measures glibc's default heap instead)::

    .venv/bin/python benchmarks/memory.py [--steps 6] [--batch-size 1024] [--width 512]
                                          [--depth 16] [--device cpu|cuda] [--only NAME ...]
                                          [--default-malloc]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
CLASSES = 10
SEED = 1234
# glibc: serve every allocation of 64 KiB or more with its own mmap, returned to the OS on
# free, so the resident set follows the live tensors instead of glibc's retained heap.
MMAP_THRESHOLD = 64 * 1024


@dataclass(frozen=True)
class Variant:
    """One row of the table: a label and the TrainingConfig fields it changes."""

    label: str
    overrides: dict[str, Any] = field(default_factory=dict)


def _bf16(level: str) -> dict[str, Any]:
    return {"mixed_precision": True, "amp_level": level, "amp_dtype": "bfloat16"}


VARIANTS: dict[str, Variant] = {
    "baseline": Variant("baseline (fp32, AdamW)"),
    "o1_bf16": Variant("mixed precision O1 bf16", _bf16("O1")),
    "o2_bf16": Variant("mixed precision O2 bf16", _bf16("O2")),
    "o3_bf16": Variant("mixed precision O3 bf16", _bf16("O3")),
    "checkpointing": Variant("gradient checkpointing (fp32)", {"gradient_checkpointing": True}),
    "adamw": Variant("optimizer adamw (= baseline, rerun)", {"optimizer": "adamw"}),
    "adam": Variant("optimizer adam", {"optimizer": "adam"}),
    # SGD gets a larger step so that its loss visibly moves in a few steps, like Adam's.
    "sgd": Variant("optimizer sgd (momentum 0.9)", {"optimizer": "sgd", "learning_rate": 0.05}),
    "memory_efficient_adam": Variant(
        "optimizer memory_efficient_adam", {"optimizer": "memory_efficient_adam"}
    ),
    "adam8bit": Variant("optimizer adam8bit", {"optimizer": "adam8bit"}),
}


# -- the child: one configuration -------------------------------------------------------------


class ResidualBlock(nn.Module):
    """``x + GELU(Linear(LayerNorm(x)))``: a pre-norm residual MLP block. The residual path and
    the norm keep a deep stack trainable in a few steps (a plain Linear+GELU stack this deep
    barely moves its loss), and each block keeps three ``batch x width`` activations for
    backward (the norm's input, the Linear's input, the GELU's input)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(self.norm(x)))


def build_model(width: int, depth: int) -> nn.Sequential:
    """``depth`` residual blocks, a LayerNorm and a Linear(width, 10) head in one flat
    ``nn.Sequential``, so gradient checkpointing can split it into segments."""
    blocks: list[nn.Module] = [ResidualBlock(width) for _ in range(depth)]
    return nn.Sequential(*blocks, nn.LayerNorm(width), nn.Linear(width, CLASSES))


def synthetic_data(samples: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian inputs labelled by a fixed random linear teacher: learnable, so the loss falls."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, width, generator=generator)
    teacher = torch.randn(width, CLASSES, generator=generator)
    targets = (inputs @ teacher).argmax(dim=1)
    return inputs, targets


def _config(variant: Variant, batch_size: int, steps: int) -> Any:
    import ace3

    fields: dict[str, Any] = {
        "batch_size": batch_size,
        "max_steps": steps,
        "epochs": 1,
        "validation_split": 0,
        "log_interval": 1,
        "optimizer": "adamw",
        "learning_rate": 1e-3,
        "seed": SEED,
    }
    return ace3.TrainingConfig(**{**fields, **variant.overrides})


def _train(variant: Variant, width: int, depth: int, batch_size: int, steps: int) -> Any:
    import ace3

    torch.manual_seed(SEED)
    model = build_model(width, depth)
    data = synthetic_data(batch_size * steps, width, SEED + 1)
    # The engine logs every step to stdout; keep stdout for the JSON this process hands back.
    with contextlib.redirect_stdout(sys.stderr):
        return ace3.Trainer(_config(variant, batch_size, steps)).train(
            model, data, show_progress=False
        )


def run_one(name: str, width: int, depth: int, batch_size: int, steps: int) -> dict[str, Any]:
    """Train configuration ``name`` (after a tiny warm-up run) and return its figures."""
    variant = VARIANTS[name]
    _train(variant, width=16, depth=2, batch_size=8, steps=2)  # warm-up: one-time costs
    started = time.perf_counter()
    result = _train(variant, width, depth, batch_size, steps)
    elapsed = time.perf_counter() - started
    final = result.final_metrics
    losses = [value for _, value in sorted(result.history.get("train_loss", []))]
    speeds = [value for step, value in result.history.get("samples_per_sec", []) if step > 1]
    return {
        "name": name,
        "label": variant.label,
        "device": final.get("memory_device"),
        "peak_memory_mb": final["peak_memory_mb"],
        "absolute_peak_memory_mb": final["absolute_peak_memory_mb"],
        "state_memory_mb": final["state_memory_mb"],
        "memory_efficiency": final.get("memory_efficiency"),
        "steps": final["steps"],
        # The best step: other processes on shared cores only ever slow a step down.
        "samples_per_sec": max(speeds) if speeds else None,
        "first_loss": losses[0] if losses else None,
        "final_loss": final.get("train_loss", losses[-1] if losses else None),
        "elapsed_s": elapsed,
        "parameters": sum(p.numel() for p in result.model.parameters()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "malloc_mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
        "gpu": torch.cuda.get_device_name() if final.get("memory_device") == "cuda" else None,
    }


# -- the parent: one subprocess per configuration, then the table ------------------------------


def run_child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable, str(Path(__file__).resolve()), "--one", name, "--json",
        "--steps", str(args.steps), "--batch-size", str(args.batch_size),
        "--width", str(args.width), "--depth", str(args.depth), "--device", args.device,
    ]  # fmt: skip
    env = {**os.environ, "ACE3_DEVICE": args.device}
    if args.default_malloc:
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
    elif args.device == "cpu":
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD))
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO / "sdk"), env.get("PYTHONPATH", "")])
    )
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=args.timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise SystemExit(
            f"configuration {name!r} ran past --timeout {args.timeout:g} s; lower --steps or "
            "--batch-size, or raise --timeout"
        ) from exc
    if done.returncode != 0:
        raise SystemExit(
            f"configuration {name!r} failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_table(rows: list[dict[str, Any]]) -> str:
    baseline = next((r for r in rows if r["name"] == "baseline"), rows[0])
    header = [
        "configuration",
        "peak MiB",
        "state MiB",
        "x baseline",
        "samples/s (best step)",
        "train loss first -> last",
    ]
    body = []
    for row in rows:
        ratio = (
            row["peak_memory_mb"] / baseline["peak_memory_mb"]
            if baseline["peak_memory_mb"]
            else None
        )
        body.append(
            [
                row["label"],
                _fmt(row["peak_memory_mb"], ".1f"),
                _fmt(row["state_memory_mb"], ".1f"),
                _fmt(ratio, ".2f"),
                _fmt(row["samples_per_sec"], ".0f"),
                f"{_fmt(row['first_loss'], '.4f')} -> {_fmt(row['final_loss'], '.4f')}",
            ]
        )
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(header), rule, *(line(cells) for cells in body)])


def notes(rows: list[dict[str, Any]]) -> str:
    """How to read the table: what the columns measure and what the runs showed."""
    by_name = {row["name"]: row for row in rows}
    first = rows[0]
    bullets: list[str] = []
    if first["device"] == "cuda":
        bullets.append(
            "peak MiB is torch.cuda.max_memory_allocated over the run: every live tensor at the "
            "worst moment, the weights included (the engine moves the model to the GPU after "
            "measuring starts); not the caching allocator's reserve or CUDA's context."
        )
    else:
        bullets.append(
            "peak MiB is the growth of the process's resident set (RSS) above its size when "
            "training started: gradients, optimizer state, O2's master copies, activations and "
            "temporaries. The float32 weights were built before and are not in it (O2 and O3 "
            "free them when they cast the model to bf16, which offsets part of their growth)."
        )
        if first["malloc_mmap_threshold"] is None:
            bullets.append(
                "with glibc's default settings freed activations stay in the C heap, so RSS is a "
                "high-water mark of the heap rather than of live tensors: it drifts up from step "
                "to step, varies between identical runs, and savings that come after the heap "
                "has grown (checkpointing, smaller optimizer state) barely show."
            )
        else:
            bullets.append(
                f"children ran with MALLOC_MMAP_THRESHOLD_={first['malloc_mmap_threshold']}: "
                "each tensor gets its own pages, returned to the OS when freed, so RSS follows "
                "the live tensors. Without it (--default-malloc, what a normal run reports) "
                "glibc keeps freed activations in its heap: peaks read higher, drift from step "
                "to step and vary between identical runs."
            )
    bullets += [
        "bf16 autocast (O1) runs only the matmuls (the Linear layers) in bf16: LayerNorm's "
        "input and the residual stream stay float32, and bf16 copies of each Linear's input and "
        "weight are kept for backward beside their float32 originals, so O1 saves at most a "
        "third of this model's activations, not half. O3 (all bf16, no master copies) halves "
        "activations and state alike; O2 adds float32 masters back.",
        "gradient checkpointing keeps only the inputs of about sqrt(layers) segments and "
        "recomputes each segment in backward: most activation memory goes, for one more "
        "forward pass per step.",
    ]
    if "baseline" in by_name and "adamw" in by_name:
        spread = abs(by_name["baseline"]["peak_memory_mb"] - by_name["adamw"]["peak_memory_mb"])
        bullets.append(
            f"baseline and 'adamw (rerun)' are the same configuration: their peaks differ by "
            f"{spread:.1f} MiB, the noise of this measurement."
        )
    state = (
        "state MiB is the engine's state_memory_mb: parameters (in the model's dtype) + "
        "gradients + optimizer state, at the end of the run."
    )
    masters_mb = first["parameters"] * 4 / 2**20
    if "o2_bf16" in by_name and "o3_bf16" in by_name:
        gap = by_name["o2_bf16"]["state_memory_mb"] - by_name["o3_bf16"]["state_memory_mb"]
        if gap < masters_mb:  # the float32 masters are missing from the engine's figure
            state += (
                f" For O2 it leaves out the float32 master weights ({masters_mb:.1f} MiB here) "
                "and their float32 gradients, which belong to the optimizer, not the model; "
                "the peak column includes them."
            )
    bullets += [
        state,
        "the optimizers' peaks differ by their state: sgd keeps one momentum buffer, "
        "memory_efficient_adam and adam8bit about a quarter of Adam's two moments. adam and "
        "adamw take identical steps here (weight_decay=0). adam8bit is slow on CPU (plain torch "
        "quantization every step; on CUDA it uses bitsandbytes when installed).",
        "samples/s is the fastest step of each run; on shared cores compare rows of one run "
        "only. bf16 is fast on CPUs with AVX512-BF16 or AMX.",
    ]
    device = "CUDA" if first["device"] == "cuda" else "CPU"
    wrapped = [
        textwrap.fill(bullet, width=94, initial_indent="- ", subsequent_indent="  ")
        for bullet in bullets
    ]
    return "\n".join([f"How to read the {device} figures:", *wrapped]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per run")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--width", type=int, default=512, help="features of each hidden layer")
    parser.add_argument("--depth", type=int, default=16, help="residual blocks")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=list(VARIANTS),
        help="run only these configurations (ratios are to the first one unless baseline runs)",
    )
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="CPU: keep glibc's default allocator settings (RSS then includes freed memory the "
        "heap keeps; by default children run with MALLOC_MMAP_THRESHOLD_=65536)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    parser.add_argument("--one", choices=list(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "width", "depth"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

    if args.one is not None:
        row = run_one(args.one, args.width, args.depth, args.batch_size, args.steps)
        print(json.dumps(row) if args.json else row, flush=True)
        return 0

    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; use --device cpu")
    names = args.only or list(VARIANTS)
    rows = []
    started = time.perf_counter()
    for index, name in enumerate(names, 1):
        row = run_child(name, args)
        rows.append(row)
        print(f"[{index}/{len(names)}] {name}: {row['elapsed_s']:.1f} s training", file=sys.stderr)
    total = time.perf_counter() - started
    first = rows[0]
    params = first["parameters"]
    print(
        f"model: Sequential of {args.depth} residual blocks x + GELU(Linear(LayerNorm(x))) of "
        f"width {args.width}, LayerNorm, Linear({args.width}, {CLASSES}): "
        f"{params / 1e6:.2f} M parameters ({params * 4 / 2**20:.1f} MiB in float32)"
    )
    print(
        f"data: synthetic, batch {args.batch_size} x {args.width} features, {args.steps} steps "
        f"per configuration, each in a fresh process ({total:.0f} s in all)"
    )
    where = first["gpu"] or f"{first['threads']} torch threads, {platform.machine()}"
    print(
        f"device: {first['device']} ({where}), torch {first['torch']}, "
        f"Python {platform.python_version()}"
    )
    if first["device"] == "cpu":
        threshold = first["malloc_mmap_threshold"]
        print(
            f"allocator: glibc with MALLOC_MMAP_THRESHOLD_={threshold} (freed tensors go back to "
            "the OS, so RSS follows live tensors)"
            if threshold
            else "allocator: default settings (RSS includes freed memory the C heap keeps)"
        )
    print()
    print(render_table(rows))
    print()
    print(notes(rows), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
