"""Batch-size growth's cost and effect, side by side, in one process (in-process ``Trainer``).

The same MLP (``--inputs``-``--width``x``--depth``-10, ReLU, AdamW) on the same synthetic data,
with the same seed, trained for one epoch four ways, alternating, ``--repeats`` times:

- **plain 32**: ``batch_size=32`` (growth off);
- **fixed 32 of 8s**: growth with ``initial = target = 32``, ``min_batch_size=8``: every step
  concatenates four loader batches of 8 into the same 32 samples, so the difference from
  *plain 32* is what the growth machinery costs per step (loader granularity, concatenation,
  the controller);
- **plain 8**: ``batch_size=8``, where a grown run starts;
- **growth 8 -> 32**: ``initial_batch_size=8``, ``target_batch_size=32``, ``stable_steps``
  ``--stable``.

Printed: the median over repeats of each run's steady ``samples_per_sec`` (the median of its
metrics reports after the first), its optimizer steps and final ``train_loss``. ::

    .venv/bin/python benchmarks/batch_growth.py [--repeats 3] [--samples 8192]
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

import ace3


def build(inputs: int, width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(inputs, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def run(data: TensorDataset, args: argparse.Namespace, **fields: Any) -> tuple[float, int, float]:
    config = ace3.TrainingConfig(
        epochs=1, validation_split=0, log_interval=20, seed=0, learning_rate=1e-3, **fields
    )
    result = ace3.Trainer(config).train(build(args.inputs, args.width, args.depth), data)
    speeds = [value for _, value in result.history["samples_per_sec"]][1:]
    return (
        statistics.median(speeds),
        int(result.final_metrics["steps"]),
        float(result.final_metrics["train_loss"]),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--inputs", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--stable", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(args.samples, args.inputs, generator=generator)
    data = TensorDataset(inputs, torch.randint(0, 10, (args.samples,), generator=generator))

    def growth(initial: int, target: int) -> ace3.DynamicBatchSizeConfig:
        return ace3.DynamicBatchSizeConfig(
            min_batch_size=8, initial_batch_size=initial, target_batch_size=target,
            stable_steps=args.stable,
        )  # fmt: skip

    variants: dict[str, dict[str, Any]] = {
        "plain 32": {"batch_size": 32},
        "fixed 32 of 8s": {"dynamic_batch_size": growth(32, 32)},
        "plain 8": {"batch_size": 8},
        "growth 8 -> 32": {"dynamic_batch_size": growth(8, 32)},
    }
    results: dict[str, list[tuple[float, int, float]]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fields in variants.items():
            results[name].append(run(data, args, **fields))
    print(f"\n{args.samples} samples, MLP {args.inputs}-{args.width}x{args.depth}-10, 1 thread, "
          f"{args.repeats} repeat(s)")  # fmt: skip
    print(f"{'run':<16} {'samples/s (median)':>19} {'steps':>6} {'final train_loss':>17}")
    for name, runs in results.items():
        speed = statistics.median(r[0] for r in runs)
        print(f"{name:<16} {speed:>19.0f} {runs[0][1]:>6} {runs[0][2]:>17.4f}")
    plain, fixed = (statistics.median(r[0] for r in results[n]) for n in ("plain 32",
                                                                          "fixed 32 of 8s"))  # fmt: skip
    print(f"growth machinery at a fixed 32: {fixed / plain:.3f}x the plain run's throughput")


if __name__ == "__main__":
    main()
