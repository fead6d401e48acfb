"""Throughput and memory of each parallel strategy on 1, 2 and 4 processes, side by side.

Every cell is a real job of the engine: ``torchrun --standalone --nproc-per-node N -m
ace3.runtime --job job.json`` (gloo on CPU, nccl with ``--device cuda``), the same entry point
a worker launches. The model is an ``nn.Sequential`` MLP (``depth`` x Linear(width, width)+ReLU
and a 10-class head) on synthetic data written by this script (nothing is downloaded); every
run uses the same global batch and seed. Printed per cell:

- ``samples/s``: the median of the engine's global ``samples_per_sec`` reports after the
  first (which includes start-up);
- ``peak MiB/rank``: the engine's ``peak_memory_mb`` (the busiest rank's growth of resident
  memory on CPU, ``max_memory_allocated`` on CUDA);
- ``state MiB/rank``: rank 0's parameters + gradients + optimizer state (``state_memory_mb``):
  what sharding divides.

Strategies: ``ddp`` (data parallel), ``zero1``, ``zero2``, ``zero3``, and, when the engine
supports them, ``pipeline-gpipe``, ``pipeline-1f1b``, ``layer``, ``tensor`` (a strategy the
engine refuses is shown as such, with its reason). A strategy needs at least 2 processes where
it splits the model; its 1-process cell is the plain single-process run. ::

    .venv/bin/python benchmarks/scaling.py [--procs 1 2 4] [--strategies ...] [--steps 30]
                                           [--batch-size 256] [--width 1024] [--depth 8]
                                           [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.synthetic import write_inputs  # noqa: E402

SDK = REPO / "sdk"

MODEL_FILE = """
from torch import nn


def build_model(width=1024, depth=8):
    layers = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)
"""

# Config fields of each strategy (merged over the common ones).
STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp": {},
    "zero1": {"zero_stage": 1},
    "zero2": {"zero_stage": 2},
    "zero3": {"zero_stage": 3},
    "pipeline-gpipe": {"parallelism": "pipeline", "pipeline_schedule": "gpipe"},
    "pipeline-1f1b": {"parallelism": "pipeline", "pipeline_schedule": "1f1b"},
    "layer": {"parallelism": "model", "model_sharding_strategy": "layer"},
    "tensor": {"parallelism": "model", "model_sharding_strategy": "tensor"},
}
SPLITS_THE_MODEL = {"pipeline-gpipe", "pipeline-1f1b", "layer", "tensor"}


def job_config(strategy: str, procs: int, args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {
        "num_gpus": procs,
        "batch_size": args.batch_size,
        "max_steps": args.steps,
        "epochs": 1000,
        "log_interval": 5,
        "validation_split": 0,
        "learning_rate": 1e-3,
        "seed": 11,
        "dynamic_batch_size": False,
    }
    if procs > 1 or strategy not in SPLITS_THE_MODEL:
        config.update(STRATEGIES[strategy])
        if strategy.startswith("pipeline"):  # layer parallel: one stage per process by itself
            config["num_stages"] = procs
            config["micro_batch_size"] = args.batch_size // (2 * procs)
    return config


def run_cell(
    strategy: str, procs: int, args: argparse.Namespace, root: Path, model: Path, data: Path
) -> dict[str, Any]:
    job_dir = root / f"{strategy}-{procs}"
    job_dir.mkdir()
    job = {
        "job_id": f"scaling-{strategy}-{procs}",
        "config": job_config(strategy, procs, args),
        "model": {"path": str(model), "kwargs": {"width": args.width, "depth": args.depth}},
        "dataset": {"path": str(data)},
        "output_dir": str(job_dir / "output"),
    }
    (job_dir / "job.json").write_text(json.dumps(job))
    threads = max(1, (os.cpu_count() or 1) // procs)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "ACE3_DEVICE": args.device,
        "PYTHONPATH": os.pathsep.join([str(SDK), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(procs), "-m", "ace3.runtime", "--job", str(job_dir / "job.json")]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.monotonic() - started
    if done.returncode != 0:
        # The first exception a rank printed (e.g. "ValueError: unsupported settings: ...").
        errors = [
            line.split("] ", 1)[-1]
            for line in (done.stdout + done.stderr).splitlines()
            if re.search(r"^\[rank \d+\] \w*(Error|Exception): ", line)
        ]
        reason = errors[0] if errors else (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": reason[:160], "wall_s": wall}
    events = [json.loads(x) for x in (job_dir / "output" / "events.jsonl").read_text().splitlines()]
    speeds = [
        e["values"]["samples_per_sec"]
        for e in events
        if e["type"] == "metrics" and "samples_per_sec" in e["values"]
    ]
    final = events[-1]["final_metrics"]
    losses = [
        e["values"]["train_loss"]
        for e in events
        if e["type"] == "metrics" and "train_loss" in e["values"]
    ]
    return {
        "samples_per_sec": statistics.median(speeds[1:] or speeds),
        "peak_mb": final.get("peak_memory_mb"),
        "state_mb": final.get("state_memory_mb"),
        "loss": (losses[0], losses[-1]),
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    import torch

    params = 64 * args.width + args.depth * args.width * args.width + args.width * 10
    print(
        f"model: MLP, {args.depth} x Linear({args.width}, {args.width}) + head, "
        f"{params / 1e6:.2f} M parameters ({params * 4 / 2**20:.1f} MiB float32); global batch "
        f"{args.batch_size}, {args.steps} steps, AdamW"
    )
    print(
        f"device: {args.device}, {os.cpu_count()} CPU(s), torch {torch.__version__}, "
        f"Python {platform.python_version()}"
    )
    results: dict[tuple[str, int], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ace3-scaling-") as scratch:
        root = Path(scratch)
        model, data = write_inputs(root, args.batch_size * (args.steps + 2), 64, MODEL_FILE)
        for strategy in args.strategies:
            for procs in args.procs:
                results[strategy, procs] = run_cell(strategy, procs, args, root, model, data)
    header = "strategy".ljust(16) + "".join(
        f"| {p} proc{'s' if p > 1 else ''}: samples/s  peak MiB/rank  state MiB/rank ".ljust(54)
        for p in args.procs
    )
    print()
    print(header)
    print("-" * len(header))
    for strategy in args.strategies:
        row = strategy.ljust(16)
        for procs in args.procs:
            cell = results[strategy, procs]
            if "error" in cell:
                text = f"refused/failed: {cell['error']}"
            else:
                text = (
                    f"{cell['samples_per_sec']:9.0f}  {cell['peak_mb'] or 0:13.1f}  "
                    f"{cell['state_mb'] or 0:14.1f}"
                )
            row += f"| {text}".ljust(54)[:54]
        print(row)
    print()
    print("train loss first -> last per cell (the same model, seed and global batch):")
    for (strategy, procs), cell in results.items():
        if "loss" in cell:
            first, last = cell["loss"]
            print(f"  {strategy:16} {procs}: {first:.4f} -> {last:.4f}  ({cell['wall_s']:.0f} s)")
        else:
            print(f"  {strategy:16} {procs}: {cell['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
